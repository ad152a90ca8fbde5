"""The Kafka adapters: connecting, producing, consuming, admin, scans and partitioning.

The only code that imports aiokafka; code above it sees `Consumer`, `JobProducer`,
`Admin` and our `errors.py` types. `TopicPartition` (a named tuple of topic and
partition) is the one aiokafka type that travels up, re-exported here.
"""

from aiokafka.structs import TopicPartition

__all__ = ["TopicPartition"]
