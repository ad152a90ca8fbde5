"""The Kafka adapters: connecting, producing, consuming, admin, scans and partitioning.

The only code that imports aiokafka. Code above it sees our `errors.py` types only.
"""
