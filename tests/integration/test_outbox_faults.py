"""The outbox under faults, on real processes and servers: a relay killed with SIGKILL
mid-batch, Kafka down (a broker of the test's own), Postgres down (a server of the
test's own), and the relay every `stream-jobs worker` runs.

The 30 s Kafka outage is `make chaos`'s `outbox` trial; here the same trial runs short.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from ops.chaos.outbox import OwnBroker, free_port_pair, outage_trial
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.errors import OutboxWriteError
from stream_jobs.naming import lane_topic
from stream_jobs.outbox.depth import read_depth
from stream_jobs.outbox.relay import APPLICATION_NAME, OutboxRelay
from stream_jobs.settings import Settings
from stream_jobs.stack import PostgresServer
from tests.integration.cli_env import settings_env
from tests.integration.conftest import Declare
from tests.integration.database import connect
from tests.integration.topic_reader import read_topic
from tests.waiting import until

from ..conftest import Stack

TYPE = "shop.order"
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def shop(app: App, declare: Declare, settings: Settings) -> App:
    await declare(TYPE, partitions=3)
    conn = await connect(settings)
    await conn.execute("CREATE TABLE effects (job_id text NOT NULL)")
    await conn.close()
    from tests.apps.shop import app as shop_app

    shop_app.use_settings(settings)
    return shop_app


async def commit_jobs(app: App, settings: Settings, n: int, per_tx: int = 100) -> list[str]:
    client = app.client()
    conn = await connect(settings)
    ids: list[str] = []
    try:
        for start in range(0, n, per_tx):
            async with conn.transaction():
                ids += await client.enqueue_many(
                    [Job(TYPE, {"n": i}, key=f"k{i % 11}") for i in range(start, start + per_tx)],
                    conn=conn)
    finally:
        await conn.close()
    return ids


async def ids_in_kafka(settings: Settings) -> list[str]:
    return [dict(r.headers)["sj-job-id"].decode()
            for r in await read_topic(settings, lane_topic(settings.topic_prefix, TYPE))]


def start(argv: list[str], settings: Settings, log: Path, **env: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([str(STREAM_JOBS), *argv], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, env=settings_env(settings, **env))


# Makes a relay's DELETE take 200 ms, after Kafka acknowledged its batch and before it
# commits: the window where a kill leaves sent rows behind, made wide enough to hit.
SLOW_DELETES = """
CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
CREATE TRIGGER slow_delete BEFORE DELETE ON stream_jobs_outbox
  FOR EACH STATEMENT EXECUTE FUNCTION slow_delete();
"""


async def relay_at(watch: asyncpg.Connection, phase: str) -> bool:
    """The relay process is mid-batch: "sending" (claimed rows, waiting on Kafka: its
    claim connection idle in a transaction after the ordering check) or "deleting"
    (Kafka acknowledged; the delete runs, uncommitted). Asked on one open connection
    (`watch`): the sending window is a few milliseconds, and a poll that first connects
    to Postgres missed it for 30 s on a loaded machine."""
    state, query = (("idle in transaction", "SELECT topic, key, min(id)%") if phase == "sending"
                    else ("active", "DELETE FROM%"))
    return bool(await watch.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
        "AND state = $2 AND query LIKE $3", APPLICATION_NAME, state, query))


async def _moved_since(settings: Settings, depth: int) -> bool:
    return (await read_depth(settings)).depth < depth


async def sent_but_not_deleted(settings: Settings) -> set[str]:
    """The jobs of rows still in the outbox that are already in Kafka: the killed relay's
    batch, acknowledged by the broker but not yet deleted."""
    in_kafka = set(await ids_in_kafka(settings))
    conn = await connect(settings)
    try:
        waiting = [r[0] for r in await conn.fetch(
            "SELECT headers->0->>1 FROM stream_jobs_outbox")]
    finally:
        await conn.close()
    return {job_id for job_id in waiting if job_id in in_kafka}


async def test_a_relay_killed_mid_batch_loses_nothing_and_doubles_no_effect(
        shop: App, settings: Settings, tmp_path: Path) -> None:
    ids = await commit_jobs(shop, settings, 3_000)
    conn = await connect(settings)
    await conn.execute(SLOW_DELETES)
    log = tmp_path / "relay.log"
    # A set: a row left behind by one kill may still be waiting at the next one, and is
    # one more send (one duplicate) however often it is seen.
    caught: set[str] = set()
    watch = await asyncpg.connect(settings.database_url)
    for phase in ("sending", "deleting", "deleting"):
        relay = start(["outbox", "relay", "--batch", "40"], settings, log)
        try:
            await until(lambda phase=phase: relay_at(watch, phase),  # type: ignore[misc]
                        f"the relay is {phase} a batch", within_s=30)
        finally:
            relay.send_signal(signal.SIGKILL)
            relay.wait()
        caught |= await sent_but_not_deleted(settings)
    await watch.close()
    await conn.execute("DROP TRIGGER slow_delete ON stream_jobs_outbox")
    await conn.close()
    assert caught, "no kill landed between the broker's ack and the relay's commit"
    # And at full speed, wherever a kill falls: as soon as the relay is seen moving rows.
    for _ in range(2):
        before = (await read_depth(settings)).depth
        relay = start(["outbox", "relay", "--batch", "40"], settings, log)
        try:
            await until(lambda before=before: _moved_since(settings, before),  # type: ignore[misc]
                        "the relay moves rows", within_s=30)
        finally:
            relay.send_signal(signal.SIGKILL)
            relay.wait()
    assert (await read_depth(settings)).depth > 0, "the relay finished before the last kill"
    # A fresh relay, alone and to the end: what the killed ones left is sent again.
    survivor = start(["outbox", "relay", "--until-idle"], settings, log)
    assert await asyncio.to_thread(survivor.wait, 120) == 0, log.read_text()[-2000:]
    assert (await read_depth(settings)).depth == 0
    seen = await ids_in_kafka(settings)
    assert set(seen) == set(ids), "a committed job never reached Kafka"
    duplicates = len(seen) - len(set(seen))
    print(f"\n[relay kill -9] 5 kills, {len(caught)} rows acked but not deleted at the kills, "
          f"{duplicates} duplicates in Kafka")
    assert duplicates >= len(caught)
    # The duplicates are absorbed by job ID through ctx.once(): one effect per job.
    worker = shop.worker(TYPE)
    await worker.run(until_idle=True)
    conn = await connect(settings)
    try:
        effects = [r[0] for r in await conn.fetch("SELECT job_id FROM effects")]
    finally:
        await conn.close()
    assert sorted(effects) == sorted(ids)
    assert worker.outcomes["succeeded"] == len(ids)
    assert worker.outcomes["duplicate"] == duplicates


async def test_the_worker_command_runs_a_relay_unless_told_not_to(
        shop: App, settings: Settings, tmp_path: Path) -> None:
    ids = await commit_jobs(shop, settings, 200)
    log = tmp_path / "worker.log"
    argv = ["worker", "tests.apps.shop:app", "--type", TYPE]
    off = start(argv, settings, log, STREAM_JOBS_OUTBOX_RELAY="false")
    try:
        async with shop.client() as client:  # a job enqueued straight to Kafka runs...
            probe = await client.enqueue(TYPE, {"n": -1})
        await until(lambda: has_effects(settings, {probe}), "the probe job ran", within_s=60)
        assert (await read_depth(settings)).depth == 200  # ...while the outbox waits
    finally:
        off.send_signal(signal.SIGTERM)
        await asyncio.to_thread(off.wait, 30)
    on = start(argv, settings, log)
    try:
        await until(lambda: has_effects(settings, set(ids)),
                    "the worker relayed and ran the jobs", within_s=60)
    finally:
        on.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(on.wait, 30) == 0, log.read_text()[-2000:]
    assert (await read_depth(settings)).depth == 0


async def has_effects(settings: Settings, wanted: set[str]) -> bool:
    conn = await connect(settings)
    try:
        return wanted <= {r[0] for r in await conn.fetch("SELECT job_id FROM effects")}
    finally:
        await conn.close()


# -- Kafka down ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_broker() -> Iterator[OwnBroker]:
    broker = OwnBroker()
    try:
        asyncio.run(broker.up())
        yield broker
    finally:
        broker.remove()


async def test_kafka_down_rows_wait_then_all_go(own_broker: OwnBroker, stack: Stack) -> None:
    # CI-sized: a 6 s outage (`make chaos` runs 30 s).
    result = await outage_trial(own_broker, stack.database_url, outage_s=6.0,
                                jobs_per_s=200.0, before_s=1.5)
    print(f"\n[kafka down] {result}")
    assert result.ok, result.problems
    assert result.lost == 0
    assert result.committed_during_outage > 0
    assert result.max_depth > 0
    # The callers' commits never waited on Kafka.
    assert result.slowest_commit_s < 2.0


# -- Postgres down ------------------------------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    root = Path(tempfile.mkdtemp(prefix="stream-jobs-outbox-pg-"))
    os.chmod(root, 0o755)  # the server runs as an unprivileged user when we are root
    server = PostgresServer(Settings(stack_dir=root, dev_postgres_port=free_port_pair()))
    try:
        server.up()
        yield server
    finally:
        server.down()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(server.home, ignore_errors=True)


@pytest.fixture
async def on_own_postgres(own_postgres: PostgresServer, settings: Settings,
                          declare: Declare) -> tuple[App, Settings]:
    from stream_jobs.postgres.migrate import prepare_schema

    moved = settings.model_copy(update={"database_url": own_postgres.dsn})
    await prepare_schema(moved, ["CREATE TABLE orders (id int PRIMARY KEY)"])
    await declare(TYPE, partitions=1)
    return App(moved), moved


async def test_postgres_down_fails_the_callers_transaction(
        on_own_postgres: tuple[App, Settings], own_postgres: PostgresServer) -> None:
    app, settings = on_own_postgres
    client = app.client()
    committed = await commit_jobs(app, settings, 20, per_tx=10)  # before the outage
    conn = await connect(settings)
    await conn.execute("BEGIN")
    await conn.execute("INSERT INTO orders VALUES (1)")
    await asyncio.to_thread(own_postgres.down)  # pg_ctl stop -m fast: sessions are cut
    try:
        # The caller's enqueue fails with their transaction, as any write of theirs would.
        with pytest.raises(OutboxWriteError, match="roll the transaction back"):
            await client.enqueue(TYPE, {"n": 1}, conn=conn)
        with pytest.raises((asyncpg.InterfaceError, asyncpg.PostgresConnectionError, OSError)):
            await conn.execute("INSERT INTO orders VALUES (2)")
        # A relay started meanwhile waits for Postgres instead of giving up.
        stop = asyncio.Event()
        relay = OutboxRelay(settings)
        relaying = asyncio.create_task(relay.run(stop))
        await until(lambda: relay.failures >= 2, "the relay tried twice and waits")
        assert not relaying.done()
    finally:
        conn.terminate()
        await asyncio.to_thread(own_postgres.up)
    try:
        await until(lambda: relay.moved == len(committed), "the relay moved the rows once "
                    "Postgres was back", within_s=60)
    finally:
        stop.set()
        await relaying
    conn = await connect(settings)
    try:
        assert await conn.fetchval("SELECT count(*) FROM orders") == 0
        assert await conn.fetchval("SELECT count(*) FROM stream_jobs_outbox") == 0
    finally:
        await conn.close()
    assert sorted(await ids_in_kafka(settings)) == sorted(committed)
