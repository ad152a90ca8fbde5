"""Fencing tokens on the real stack: a zombie worker's late write is refused by a store
that checks the token, and one job's tokens grow across every kind of delivery; each for
an `async def` handler (`await ctx.fencing_token`) and a plain `def` one, on a thread
(`ctx.fencing_token_sync()`).

The zombie test runs two `stream-jobs worker tests.apps.fenced:app` processes and
SIGSTOPs the one running the job past the session timeout (10 s), so the group gives the
job to the other; after SIGCONT the stopped one finishes its run and writes late. The
app writes each run's result twice, through the fence (`documents`) and without it
(`unfenced`), so the test sees both that the late write really came last and that the
fence refused it. Nothing waits by sleeping: every wait polls a condition to a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.dedup.store import DedupStore
from stream_jobs.dlq.requeue import SelectAll, requeue
from stream_jobs.errors import ConfigError
from stream_jobs.kafka.admin import group_state
from stream_jobs.naming import lane_topic, worker_group
from stream_jobs.settings import Settings
from stream_jobs.tools.group_offsets import reset_offsets
from stream_jobs.tools.replay import replay
from tests.apps.fenced import JOB_TYPE, SYNC_JOB_TYPE, TABLES
from tests.waiting import until

from .conftest import Declare
from .test_worker_processes import REPO, STREAM_JOBS, WorkerProcess

SESSION_TIMEOUT_S = 10.0  # the worker consumer's (stream_jobs.runtime.member)

# The handler's kind: `async def` (awaits the token) or plain `def` (takes it on its thread).
KINDS = pytest.mark.parametrize("kind", ["async", "def"])


@pytest.fixture
async def db(app: App, settings: Settings) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        yield conn
    finally:
        await conn.close()


class FencedWorkers:
    """`stream-jobs worker tests.apps.fenced:app` processes; killed at teardown."""

    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.started: list[WorkerProcess] = []

    def start(self, name: str, job_type: str) -> WorkerProcess:
        s = self.settings
        env = {**os.environ, "STREAM_JOBS_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
               "STREAM_JOBS_DATABASE_URL": s.database_url,
               "STREAM_JOBS_DATABASE_SCHEMA": s.database_schema,
               "STREAM_JOBS_TOPIC_PREFIX": s.topic_prefix,
               "STREAM_JOBS_TOPICS_DIR": str(s.topics_dir)}
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(STREAM_JOBS), "worker", "tests.apps.fenced:app", "--type", job_type],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        worker = WorkerProcess(name, proc, log)
        self.started.append(worker)
        return worker

    def tails(self) -> str:
        return "\n".join(w.tail() for w in self.started)

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGCONT)
                worker.proc.kill()
            worker.proc.wait(timeout=10)


@pytest.fixture
def workers(settings: Settings, tmp_path: Path) -> Iterator[FencedWorkers]:
    pool = FencedWorkers(settings, tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()


@KINDS
async def test_a_zombies_late_write_is_refused_by_the_fence(
        app: App, declare: Declare, db: Any, workers: FencedWorkers,
        settings: Settings, kind: str) -> None:
    job_type = JOB_TYPE if kind == "async" else SYNC_JOB_TYPE
    for statement in TABLES:
        await db.execute(statement)
    # One partition: one member runs the job, the other idles until it is handed over.
    await declare(job_type, partitions=1, retry_tiers=["1s"])
    a, b = workers.start("a", job_type), workers.start("b", job_type)
    group = worker_group(settings.topic_prefix, job_type)

    async def both_in_group() -> bool:
        return await group_state(settings, group) == ("Stable", 2)

    await until(both_in_group, f"both workers in the group\n{workers.tails()}", 60)
    async with app.client() as client:
        await client.enqueue(job_type, {"doc_id": "doc-1", "body": "v1"})

    async def writes(step: str) -> list[Any]:
        return list(await db.fetch("SELECT pid, token, accepted FROM writes WHERE step = $1 "
                                   "ORDER BY id", step))

    async def drafted(n: int) -> bool:
        return len(await writes("draft")) >= n

    await until(lambda: drafted(1), f"the first run's draft\n{workers.tails()}", 60)
    [first] = await writes("draft")
    zombie, other = (a, b) if first["pid"] == a.pid else (b, a)
    assert first["accepted"]
    zombie.signal(signal.SIGSTOP)

    # Past the session timeout the group gives the job to the other, which runs it again
    # with a later token: its draft and final writes both go through the fence.
    async def other_finished() -> bool:
        return any(w["pid"] == other.pid for w in await writes("final"))

    await until(other_finished, f"the other worker's run\n{workers.tails()}",
                SESSION_TIMEOUT_S * 6)
    [rerun] = [w for w in await writes("final") if w["pid"] == other.pid]
    assert rerun["token"] > first["token"]
    assert rerun["accepted"], "the rerun's write, with the later token, was refused"

    await db.execute("UPDATE gate SET open = true; NOTIFY gate")
    zombie.signal(signal.SIGCONT)

    async def zombie_wrote() -> bool:
        return any(w["pid"] == zombie.pid for w in await writes("final"))

    await until(zombie_wrote, f"the zombie's late write\n{workers.tails()}", 60)
    [late] = [w for w in await writes("final") if w["pid"] == zombie.pid]
    assert late["token"] == first["token"]
    # Without the fence the zombie's write is the one left standing ...
    unfenced = await db.fetchval("SELECT body FROM unfenced WHERE doc_id = 'doc-1'")
    assert unfenced == f"v1 by pid {zombie.pid} with token {first['token']}"
    # ... with it, the store refused the late write and kept the rerun's.
    assert not late["accepted"], "the zombie's late write was accepted"
    stored = await db.fetchrow("SELECT body, token FROM documents WHERE doc_id = 'doc-1'")
    assert (stored["body"], stored["token"]) == (
        f"v1 by pid {other.pid} with token {rerun['token']}", rerun["token"])


# -- one job's tokens across its deliveries -----------------------------------------------


@KINDS
async def test_one_jobs_token_grows_across_retries_requeues_replays_and_redeliveries(
        app: App, declare: Declare, db: Any, settings: Settings, kind: str) -> None:
    job_type = "doc.tokens"
    await declare(job_type, partitions=1, retry_tiers=["1s"], max_attempts=2)
    seen: list[tuple[int, int, int]] = []  # (attempt, offset, token) per delivery
    failing = True

    def delivered(ctx: JobContext, token: int) -> None:
        seen.append((ctx.attempt, ctx.offset, token))
        if failing:
            raise RuntimeError("the index is down")

    if kind == "async":
        @app.job(job_type)
        async def index(job: dict[str, Any], ctx: JobContext) -> None:
            token = await ctx.fencing_token
            assert await ctx.fencing_token == token  # one token per delivery
            delivered(ctx, token)
    else:
        @app.job(job_type)
        def index_on_a_thread(job: dict[str, Any], ctx: JobContext) -> None:
            token = ctx.fencing_token_sync()
            assert ctx.fencing_token_sync() == token  # one token per delivery
            delivered(ctx, token)

    async with app.client() as client:
        job_id = await client.enqueue(job_type, {"doc": "d-1"})
    # Attempt 1 fails, attempt 2 (a new record, through the 1 s tier) fails: dead letter.
    await app.worker(job_type).run(until_idle=True)
    assert [attempt for attempt, _, _ in seen] == [1, 2]

    # Requeued with its attempts reset (attempt 1 again, a new record), and replayed with
    # the same job ID (the lane's first record written again); the handler is fixed.
    failing = False
    result = await requeue(settings, job_type, select=SelectAll(), reset_attempts=True)
    assert result.requeued == 1
    lane = lane_topic(settings.topic_prefix, job_type)
    await replay(settings, lane, partition=0, from_offset=0, to_offset=0)
    await app.worker(job_type).run(until_idle=True)
    assert [attempt for attempt, _, _ in seen] == [1, 2, 1, 1]

    # Redelivered: the group rewound to the start, the same offsets read again.
    group = worker_group(settings.topic_prefix, job_type)

    async def left() -> bool:
        return (await group_state(settings, group))[1] == 0

    await until(left, "the worker left its group")
    await reset_offsets(settings, group, topic=lane, to_earliest=True)
    before = len(seen)
    await app.worker(job_type).run(until_idle=True)
    # The lane holds the first attempt, the retry, the requeue and the replay: offsets 0-3.
    assert [offset for _, offset, _ in seen[:before]] == [0, 1, 2, 3]
    assert [offset for _, offset, _ in seen[before:]] == [0, 1, 2, 3]

    tokens = [token for _, _, token in seen]
    assert all(a < b for a, b in pairwise(tokens)), (
        f"job {job_id}: tokens not strictly growing over its deliveries: {seen}")


async def test_a_token_without_the_sequence_says_to_migrate(settings: Settings,
                                                           schema: str) -> None:
    store = DedupStore(settings)  # a fresh schema, never migrated
    try:
        with pytest.raises(ConfigError, match=r"run `stream-jobs db migrate`"):
            await store.fencing_token()
        await store.migrate()
        tokens = [await store.fencing_token() for _ in range(3)]
        assert all(a < b for a, b in pairwise(tokens))
    finally:
        await store.close()
