"""`topics plan|apply|list` against the real broker, each test under its own topic prefix.

The broker is checked with a plain aiokafka admin client, not with the code under test.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from stream_jobs.errors import BrokerUnavailable, TopicPlanError
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.connection import kafka_client_kwargs
from stream_jobs.kafka.topics import apply, list_topics, plan
from stream_jobs.settings import Settings

STREAM_JOBS = Path(sys.executable).parent / "stream-jobs"
EMAIL = """
partitions = 3
replication_factor = 1
retention = "2d"
priorities = ["high", "default", "low"]
"""


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Any]:
    """A plain admin client; deletes this test's topics afterwards to keep the broker small."""
    client = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await client.start()
    try:
        yield client
        ours = [t for t in await client.list_topics()
                if t.startswith(f"{settings.topic_prefix}.")]
        if ours:
            await client.delete_topics(ours)
    finally:
        await client.close()


def declare(settings: Settings, job_type: str, text: str) -> None:
    (settings.topics_dir / f"{job_type}.toml").write_text(text)


async def topics_on(broker: Any, prefix: str) -> dict[str, int]:
    """Topic -> partition count, for the topics under `prefix`."""
    names = [t for t in await broker.list_topics() if t.startswith(f"{prefix}.")]
    if not names:
        return {}
    return {t["topic"]: len(t["partitions"]) for t in await broker.describe_topics(names)}


async def config_of(broker: Any, topic: str, key: str) -> str:
    responses = await broker.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    for resource in responses[0].to_object()["resources"]:
        for entry in resource["config_entries"]:
            if entry["config_names"] == key:
                return str(entry["config_value"])
    raise AssertionError(f"{topic} has no {key}")


async def until_config(broker: Any, topic: str, key: str, value: str) -> None:
    """Wait (with a deadline) until the broker reads back a config just altered: it answers
    the change once the controller has it, and its own view may lag a few milliseconds."""
    deadline = time.monotonic() + 10
    while await config_of(broker, topic, key) != value:
        assert time.monotonic() < deadline, f"{topic} never showed {key}={value}"
        await asyncio.sleep(0.02)


async def test_apply_creates_exactly_the_contract_topics(settings: Settings, broker: Any
                                                         ) -> None:
    declare(settings, "email.send", EMAIL)
    p = settings.topic_prefix
    changes = await apply(settings, load_job_types(settings.topics_dir))

    expected = {f"{p}.email.send", f"{p}.email.send.high", f"{p}.email.send.low",
                f"{p}.email.send.retry-5s", f"{p}.email.send.retry-1m",
                f"{p}.email.send.retry-10m", f"{p}.email.send.dlq"}
    assert {c.topic for c in changes} == expected
    assert {c.action for c in changes} == {"create"}
    assert await topics_on(broker, p) == dict.fromkeys(expected, 3)
    for topic in expected - {f"{p}.email.send.dlq"}:
        assert await config_of(broker, topic, "retention.ms") == str(2 * 86_400_000)
    assert await config_of(broker, f"{p}.email.send.dlq", "retention.ms") == str(
        4 * 2 * 86_400_000)
    assert await config_of(broker, f"{p}.email.send", "max.message.bytes") == "2097152"

    # apply returns once every partition has a leader: a producer can write at once.
    producer = AIOKafkaProducer(**kafka_client_kwargs(settings), acks="all")
    await producer.start()
    try:
        for partition in range(3):
            sent = await producer.send_and_wait(f"{p}.email.send.high", b"{}",
                                                partition=partition)
            assert sent.offset == 0
    finally:
        await producer.stop()


async def test_a_second_apply_is_all_ok_and_plan_agrees(settings: Settings, broker: Any
                                                        ) -> None:
    declare(settings, "email.send", EMAIL)
    declare(settings, "image.resize", 'partitions = 2\nretry_tiers = ["30s"]\n')
    types = load_job_types(settings.topics_dir)
    first = await apply(settings, types)
    assert len(first) == 7 + 3
    again = await apply(settings, types)
    assert [c.topic for c in again] == [c.topic for c in first]
    assert {c.action for c in again} == {"ok"}
    assert {c.action for c in await plan(settings, types)} == {"ok"}


async def test_plan_changes_nothing(settings: Settings, broker: Any) -> None:
    declare(settings, "email.send", EMAIL)
    types = load_job_types(settings.topics_dir)
    changes = await plan(settings, types)
    assert len(changes) == 7
    assert {c.action for c in changes} == {"create"}
    assert await topics_on(broker, settings.topic_prefix) == {}

    await apply(settings, types)
    declare(settings, "email.send", EMAIL.replace("partitions = 3", "partitions = 5")
            .replace('"2d"', '"1d"'))
    changed = load_job_types(settings.topics_dir)
    assert {c.action for c in await plan(settings, changed)} == {"add-partitions", "set-config"}
    assert set((await topics_on(broker, settings.topic_prefix)).values()) == {3}
    assert await config_of(broker, f"{settings.topic_prefix}.email.send", "retention.ms") == (
        str(2 * 86_400_000))


async def test_raising_partitions_adds_them(settings: Settings, broker: Any) -> None:
    declare(settings, "email.send", EMAIL)
    await apply(settings, load_job_types(settings.topics_dir))
    declare(settings, "email.send", EMAIL.replace("partitions = 3", "partitions = 8"))
    changes = await apply(settings, load_job_types(settings.topics_dir))

    assert {c.action for c in changes} == {"add-partitions"}
    assert all(c.detail.startswith("3 -> 8 partitions") for c in changes)
    assert set((await topics_on(broker, settings.topic_prefix)).values()) == {8}
    assert {c.action for c in await plan(settings, load_job_types(settings.topics_dir))} == {
        "ok"}


async def test_shrinking_is_refused_and_changes_nothing(settings: Settings, broker: Any
                                                        ) -> None:
    declare(settings, "email.send", EMAIL.replace("partitions = 3", "partitions = 4"))
    await apply(settings, load_job_types(settings.topics_dir))
    # A retention change rides along: the whole plan is checked before anything changes.
    declare(settings, "email.send", EMAIL.replace("partitions = 3", "partitions = 2")
            .replace('"2d"', '"1d"'))
    types = load_job_types(settings.topics_dir)
    p = settings.topic_prefix

    with pytest.raises(TopicPlanError) as caught:
        await apply(settings, types)
    message = str(caught.value)
    assert message.startswith(f"{p}.email.send.high has 4 partitions; ")
    assert "email.send.toml asks for 2: Kafka cannot shrink a topic" in message
    assert message.endswith("(create a new type or keep 4).")
    with pytest.raises(TopicPlanError):
        await plan(settings, types)
    assert set((await topics_on(broker, p)).values()) == {4}
    assert await config_of(broker, f"{p}.email.send", "retention.ms") == str(2 * 86_400_000)


async def test_configs_are_set_and_hand_made_overrides_kept(settings: Settings, broker: Any
                                                            ) -> None:
    declare(settings, "email.send", EMAIL)
    await apply(settings, load_job_types(settings.topics_dir))
    topic = f"{settings.topic_prefix}.email.send"
    await broker.alter_configs([ConfigResource(
        ConfigResourceType.TOPIC, topic,
        {"retention.ms": "172800000", "max.message.bytes": "2097152", "segment.ms": "3600000"},
    )])
    await until_config(broker, topic, "segment.ms", "3600000")

    declare(settings, "email.send", EMAIL.replace('"2d"', '"1d"'))
    changes = await apply(settings, load_job_types(settings.topics_dir))
    assert {c.action for c in changes} == {"set-config"}
    assert await config_of(broker, topic, "retention.ms") == "86400000"
    assert await config_of(broker, f"{topic}.dlq", "retention.ms") == str(4 * 86_400_000)
    assert await config_of(broker, topic, "segment.ms") == "3600000"


async def test_list_shows_counts_and_undeclared_topics(settings: Settings, broker: Any) -> None:
    declare(settings, "email.send", EMAIL)
    declare(settings, "image.resize", "partitions = 2")
    types = load_job_types(settings.topics_dir)
    before = await list_topics(settings, types)
    assert len(before) == 7 + 5
    assert not any(row.exists for row in before)
    assert all(row.messages is None for row in before)

    await apply(settings, types)
    producer = AIOKafkaProducer(**kafka_client_kwargs(settings), acks="all")
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(f"{settings.topic_prefix}.email.send", b"{}",
                                         key=f"k{i}".encode())
    finally:
        await producer.stop()

    (settings.topics_dir / "image.resize.toml").unlink()
    rows = {row.topic: row for row in await list_topics(settings, load_job_types(
        settings.topics_dir))}
    lane = rows[f"{settings.topic_prefix}.email.send"]
    assert (lane.exists, lane.declared, lane.role, lane.name) == (True, True, "lane", "default")
    assert (lane.partitions, lane.messages, lane.end_offset_sum) == (3, 5, 5)
    assert rows[f"{settings.topic_prefix}.email.send.retry-1m"].name == "1m"
    kept = rows[f"{settings.topic_prefix}.image.resize.dlq"]
    assert (kept.exists, kept.declared, kept.job_type, kept.role) == (
        True, False, "image.resize", "dlq")
    assert len(rows) == 7 + 5


async def test_more_replicas_than_brokers_is_refused(settings: Settings, broker: Any) -> None:
    declare(settings, "email.send", "replication_factor = 3")
    with pytest.raises(TopicPlanError, match=r"asks for replication_factor 3 but the cluster "
                                             r"has 1 broker"):
        await apply(settings, load_job_types(settings.topics_dir))
    assert await topics_on(broker, settings.topic_prefix) == {}


async def test_no_broker_is_one_clear_error(settings: Settings) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    declare(settings, "email.send", "")
    nowhere = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{port}"})
    with pytest.raises(BrokerUnavailable, match=rf"No Kafka broker answered at 127\.0\.0\.1:"
                                                rf"{port} \(STREAM_JOBS_KAFKA_BOOTSTRAP\)"):
        await plan(nowhere, load_job_types(settings.topics_dir))


# --- the command line ---------------------------------------------------------------------


def run_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
        "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir),
        "COLUMNS": "200",  # rich wraps to the terminal; keep topic names on one line
    }
    return subprocess.run([str(STREAM_JOBS), *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


async def test_cli_apply_list_plan(settings: Settings, broker: Any) -> None:
    declare(settings, "email.send", EMAIL)
    p = settings.topic_prefix

    applied = run_cli(settings, "topics", "apply")
    assert applied.returncode == 0, applied.stderr
    assert f"{p}.email.send.retry-10m" in applied.stdout
    assert "7 topics: 7 create" in applied.stdout
    assert len(await topics_on(broker, p)) == 7

    listed = run_cli(settings, "topics", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"{p}.email.send.dlq" in listed.stdout

    planned = run_cli(settings, "topics", "plan", str(settings.topics_dir))
    assert planned.returncode == 0, planned.stderr
    assert "nothing to do" in planned.stdout


def test_cli_unknown_key_is_one_line_and_exit_1(settings: Settings) -> None:
    declare(settings, "email.send", "partitons = 6\n")
    for command in ("plan", "apply", "list"):
        result = run_cli(settings, "topics", command)
        assert result.returncode == 1
        assert "Traceback" not in result.stderr + result.stdout
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: ")
        assert "email.send.toml: unknown key 'partitons'" in lines[0]


def test_cli_without_a_broker_is_one_line_and_exit_1(settings: Settings) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    declare(settings, "email.send", "")
    nowhere = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{port}"})
    result = run_cli(nowhere, "topics", "plan")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: No Kafka broker answered at ")
