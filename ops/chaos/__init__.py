"""The fault-injection suite: `make chaos` (or `python -m ops.chaos.run`).

Drives N jobs through a group of real `stream-jobs worker` processes while faults are
injected (kill -9, SIGSTOP, broker kills and pauses, Postgres restarts and outages,
refused retry writes, rolling restarts, rebalance storms), then counts from Postgres and
Kafka what was lost, what took effect twice, what was delivered twice, whether a commit
ever passed unfinished work, and how long throughput took to come back. Four trials with
procedures of their own follow (scheduler failover, batch callbacks, cancels racing runs,
the outbox through a Kafka outage). Results go to `ops/chaos/RESULTS.md`.
"""
