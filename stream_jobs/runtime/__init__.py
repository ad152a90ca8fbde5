"""The runtime: group membership, dispatch, the worker, the delay relay, heartbeats,
reports, the run-time throttle, shadow mode, and the worker process (`host`: many types on
one loop) with its supervisor over many processes (`supervisor`, `restarts`).
"""
