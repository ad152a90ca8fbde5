"""The runtime: group membership, dispatch, the worker, the delay relay, heartbeats,
reports, the run-time throttle and shadow mode.
"""
