"""Operator tools over Kafka and Postgres: stats, job lookup, replay and offsets, probes.
"""
