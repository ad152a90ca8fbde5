"""Fault injectors on real components: Kafka brokers of the 3-node cluster (kill -9 and
SIGSTOP), the Postgres server (restart, outage) and the topic configs that make a delay
tier refuse writes. Worker faults live in `workers.py`.

Blocking stack calls (starting a broker, pg_ctl) run in a thread so the samplers keep
sampling meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable

from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from stream_jobs.job_types import TopicSpec
from stream_jobs.kafka.admin import admin_client
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer
from stream_jobs.stack.process import read_pid

POLL_S = 0.2
REFUSING_MAX_MESSAGE_BYTES = "16"


class FaultError(Exception):
    """A fault could not be injected or healed (the stack did not do what was asked)."""


async def until(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> float:
    """Poll the async `check` until it returns True; seconds taken. FaultError after
    `within_s`."""
    began = time.monotonic()
    while True:
        try:
            if await check():
                return time.monotonic() - began
        except Exception:  # a probe that fails during a fault is a "not yet"
            pass
        if time.monotonic() - began > within_s:
            raise FaultError(f"timed out after {within_s:.0f} s waiting for {what}")
        await asyncio.sleep(POLL_S)


# -- Kafka brokers -------------------------------------------------------------------------


async def partition_leader(settings: Settings, topic: str, partition: int) -> int:
    """The node id leading `topic`/`partition` now (-1 while there is none)."""
    async with admin_client(settings) as admin:
        described = await admin.describe_topics([topic])
    for entry in described:
        for p in entry["partitions"]:
            if p["partition"] == partition:
                return int(p["leader"])
    raise FaultError(f"{topic} has no partition {partition}")


async def fully_replicated(settings: Settings, topics: list[str], replicas: int) -> bool:
    """Every partition of `topics` has a leader and `replicas` in-sync replicas."""
    async with admin_client(settings) as admin:
        described = await admin.describe_topics(topics)
    return all(p["leader"] >= 0 and len(p["isr"]) >= replicas
               for entry in described for p in entry["partitions"])


def broker_pid(cluster: KafkaCluster, node_id: int) -> int:
    node = cluster.nodes[node_id - 1]
    pid = read_pid(node.pid_file, marker=str(node.config))
    if pid is None:
        raise FaultError(f"Kafka node {node_id} is not running")
    return pid


async def kill_broker(cluster: KafkaCluster, node_id: int) -> None:
    cluster.kill_node(node_id)


async def restart_brokers(cluster: KafkaCluster) -> None:
    """Start the nodes that are down; returns once they accept connections."""
    await asyncio.to_thread(cluster.up)


def pause_broker(cluster: KafkaCluster, node_id: int) -> int:
    pid = broker_pid(cluster, node_id)
    os.kill(pid, signal.SIGSTOP)
    return pid


def resume_broker(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


# -- Postgres ------------------------------------------------------------------------------


async def stop_postgres(server: PostgresServer) -> None:
    """`pg_ctl stop -m fast`: sessions are cut, open transactions roll back."""
    await asyncio.to_thread(server.down)


async def start_postgres(server: PostgresServer) -> None:
    await asyncio.to_thread(server.up)


# -- refused retry and dead-letter writes --------------------------------------------------


async def set_topic_configs(settings: Settings, configs: dict[str, dict[str, str]]) -> None:
    """Replace the dynamic configs of each topic (AlterConfigs replaces the whole set)."""
    async with admin_client(settings) as admin:
        responses = await admin.alter_configs([
            ConfigResource(ConfigResourceType.TOPIC, topic, topic_configs)
            for topic, topic_configs in configs.items()])
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"]:
                raise FaultError(f"Kafka refused the configs of {resource['resource_name']}: "
                                 f"{resource.get('error_message')}")


async def refuse_writes(settings: Settings, specs: list[TopicSpec]) -> None:
    """Make every write to these topics fail: a `max.message.bytes` smaller than any
    record batch, so the broker answers MESSAGE_TOO_LARGE (not retriable) to each produce.

    (`min.insync.replicas` above the replication factor would be the obvious way, but
    Kafka 4 caps the effective minimum at the replica count, so writes still succeed.)
    """
    await set_topic_configs(settings, {
        s.name: {**s.configs, "max.message.bytes": REFUSING_MAX_MESSAGE_BYTES}
        for s in specs})


async def accept_writes(settings: Settings, specs: list[TopicSpec]) -> None:
    await set_topic_configs(settings, {s.name: dict(s.configs) for s in specs})
