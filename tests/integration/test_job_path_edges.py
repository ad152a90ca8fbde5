"""Edges of the job path against the real stack: Postgres down, payload limits and the
producer's guarantees, the CLI's `db migrate` and worker, and the broker's topic policy.

Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import PayloadTooLarge
from stream_jobs.kafka.admin import admin_client
from stream_jobs.naming import dlq_topic, lane_topic, relay_group, tier_topic, worker_group
from stream_jobs.record import decode_record
from stream_jobs.settings import Settings

from .conftest import Declare
from .topic_reader import read_topic

CLI = str(Path(sys.executable).with_name("stream-jobs"))


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: connecting to it is refused at once, and
    no other process can start listening on it while the test runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_postgres_down_fails_once_jobs_through_their_tiers(
        declare: Declare, settings: Settings, closed_port: int) -> None:
    await declare("needs.db", partitions=1, retry_tiers=["1s"], max_attempts=2)
    down = App(settings.model_copy(update={
        "database_url": f"postgresql://stream_jobs@127.0.0.1:{closed_port}/stream_jobs"}))
    attempts: list[int] = []
    bodies: list[int] = []

    @down.job("needs.db")
    async def needs_db(job: dict[str, int], ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        async with ctx.once() as conn:
            bodies.append(ctx.attempt)
            await conn.execute("SELECT 1")

    async with down.client() as client:
        job_id = await client.enqueue("needs.db", {"n": 1})
    worker = down.worker("needs.db")
    await asyncio.wait_for(worker.run(until_idle=True), 60)

    # Never acknowledged as done: each attempt failed, went to its tier, then the DLQ.
    assert attempts == [1, 2]
    assert bodies == []
    assert worker.outcomes == Counter({"retried": 1, "dead_lettered": 1})
    prefix = settings.topic_prefix
    [retry] = await read_topic(settings, tier_topic(prefix, "needs.db", "1s"))
    [letter] = await read_topic(settings, dlq_topic(prefix, "needs.db"))
    decoded = [decode_record(key=r.key, value=r.value, headers=r.headers,
                             expected_type="needs.db", max_payload_bytes=10**6)
               for r in (retry, letter)]
    assert [(j.job_id, j.attempt) for j in decoded] == [(job_id, 2), (job_id, 2)]
    assert decoded[0].failure is not None
    assert decoded[1].failure is not None
    assert decoded[0].failure.reason == "handler-error"
    assert decoded[1].failure.reason == "max-attempts"
    # The error says what failed: the connection to Postgres.
    failure = decoded[1].failure
    assert failure.error_class.endswith("DatabaseUnavailable"), failure
    assert "STREAM_JOBS_DATABASE_URL" in failure.message


async def test_the_client_refuses_a_payload_over_the_default_limit_and_writes_durably(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("big.job", partitions=1)
    limit = settings.max_payload_bytes
    assert limit == 1_048_576  # the default, 1 MiB
    envelope = len(b'{"blob":""}')
    async with app.client() as client:
        producer = client._producer._producer
        # Idempotent (a producer ID from the broker, sequence numbers per partition) and
        # acks=all (-1): what `enqueue` returning promises.
        assert producer._txn_manager is not None
        assert producer._sender._acks == -1
        fits = await client.enqueue("big.job", {"blob": "x" * (limit - envelope)})
        assert producer._txn_manager.producer_id >= 0
        with pytest.raises(PayloadTooLarge, match=rf"1048577 bytes, over the limit of {limit}"):
            await client.enqueue("big.job", {"blob": "x" * (limit - envelope + 1)})
    # Refused before sending: the lane holds the payload at the limit and nothing else.
    records = await read_topic(settings, lane_topic(settings.topic_prefix, "big.job"))
    assert [dict(r.headers)["sj-job-id"] for r in records] == [fits.encode()]
    assert records[0].value is not None
    assert len(records[0].value) == limit


CLI_APP = '''
from stream_jobs import App, JobContext

app = App()


@app.job("flaky.cli")
async def flaky(job: dict[str, int], ctx: JobContext) -> None:
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO effects VALUES ($1, $2)", ctx.job_id, ctx.key)
'''


async def _cli(settings: Settings, cwd: Path, *args: str,
               timeout_s: float = 60) -> tuple[int, str]:
    env = {**os.environ,
           "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "STREAM_JOBS_DATABASE_URL": settings.database_url,
           "STREAM_JOBS_DATABASE_SCHEMA": settings.database_schema,
           "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
           "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir)}
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def test_cli_migrates_the_dedup_table_and_its_worker_commits_both_groups(
        declare: Declare, settings: Settings, schema: str, tmp_path: Path) -> None:
    await declare("flaky.cli", partitions=1, retry_tiers=["1s"], max_attempts=3)
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": schema})
    try:
        assert await conn.fetchval("SELECT to_regclass('stream_jobs_done')") is None
        code, out = await _cli(settings, tmp_path, "db", "migrate")
        assert code == 0, out
        assert await conn.fetchval("SELECT to_regclass('stream_jobs_done')") is not None
        await conn.execute("CREATE TABLE effects (job_id text, key text)")

        (tmp_path / "cli_app.py").write_text(CLI_APP)
        async with App(settings).client() as client:
            job_id = await client.enqueue("flaky.cli", {"n": 1}, key="k-7")
        code, out = await _cli(settings, tmp_path, "worker", "cli_app:app", "--type",
                               "flaky.cli", "--until-idle")
        assert code == 0, out

        rows = await conn.fetch("SELECT * FROM stream_jobs_done")
        assert [(r["job_id"], r["attempt"]) for r in rows] == [(job_id, 2)]
        assert [tuple(r) for r in await conn.fetch("SELECT * FROM effects")] == [(job_id, "k-7")]
    finally:
        await conn.close()

    # Both groups committed everything they read: the relay its tier record, the worker
    # the first attempt and the retry the relay put back in the lane.
    prefix = settings.topic_prefix
    async with admin_client(settings) as admin:
        relay = await admin.list_consumer_group_offsets(relay_group(prefix, "flaky.cli"))
        lanes = await admin.list_consumer_group_offsets(worker_group(prefix, "flaky.cli"))
    assert {(tp.topic, tp.partition): m.offset for tp, m in relay.items()} == {
        (tier_topic(prefix, "flaky.cli", "1s"), 0): 1}
    assert {(tp.topic, tp.partition): m.offset for tp, m in lanes.items()} == {
        (lane_topic(prefix, "flaky.cli"), 0): 2}


async def test_the_broker_never_creates_topics_on_its_own(settings: Settings) -> None:
    async with admin_client(settings) as admin:
        cluster = await admin.describe_cluster()
        brokers = [str(b["node_id"]) for b in cluster["brokers"]]
        assert brokers
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, b) for b in brokers])
    values = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            for entry in resource["config_entries"]:
                if entry["config_names"] == "auto.create.topics.enable":
                    values[resource["resource_name"]] = entry["config_value"]
    assert values == dict.fromkeys(brokers, "false")
