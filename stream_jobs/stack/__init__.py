"""The local development stack: a real Kafka 4.x broker (KRaft, from Maven-resolved jars)
and a real Postgres server, run from a data folder of the project's on loopback ports, and
the history process of a topic prefix (`stream-jobs history`) on them.

Used by `stream-jobs dev up|down|status`, `make test` and `make demo`. Not for production.
"""

from stream_jobs.stack.history import HistoryProcess
from stream_jobs.stack.kafka import KafkaCluster
from stream_jobs.stack.postgres import PostgresServer
from stream_jobs.stack.process import ServiceStatus

__all__ = ["HistoryProcess", "KafkaCluster", "PostgresServer", "ServiceStatus"]
