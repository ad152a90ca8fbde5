"""Acceptance tests of the job path with real worker processes against the real stack.

Workers run as `stream-jobs worker tests.apps.ledger:app --type ledger.post` subprocesses
and are killed (SIGKILL), stopped (SIGTERM) or left to drain (`--until-idle`); the
ledger app (tests/apps/ledger.py) records every delivery outside the dedup transaction
and its effect inside it, so the tests can count lost jobs, duplicate effects and
redeliveries per job ID. The ordering test runs its worker in-process.

Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.kafka.admin import admin_client, group_state
from stream_jobs.naming import lane_topic, worker_group
from stream_jobs.settings import Settings

from .conftest import Declare

LEDGER = "ledger.post"
APP_SPEC = "tests.apps.ledger:app"
REPO = Path(__file__).resolve().parents[2]
# The console script of the interpreter running the tests (the project's venv).
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
JOBS = 5_000
ACCOUNTS = 100
POLL_S = 0.02
GRACE_S = 10.0  # the worker's default grace period for in-flight jobs
SIGTERM_CONCURRENCY = 16


# -- worker processes -------------------------------------------------------------------


class WorkerProcess:
    """One `stream-jobs worker` subprocess, its output in a log file."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} (pid {self.pid}) log tail ---\n" + "\n".join(
            text.splitlines()[-lines:])

    async def exited(self, within_s: float) -> int:
        """The exit code, polled until `within_s` passes (then the test fails)."""
        deadline = time.monotonic() + within_s
        while (rc := self.proc.poll()) is None:
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} did not exit within {within_s:.0f} s\n{self.tail()}")
            await asyncio.sleep(POLL_S)
        return rc


class Workers:
    """Starts worker subprocesses for one test; kills whatever is left at teardown."""

    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.started: list[WorkerProcess] = []

    def start(self, name: str, *, until_idle: bool = False, options: tuple[str, ...] = (),
              **env: str) -> WorkerProcess:
        args = [str(STREAM_JOBS), "worker", APP_SPEC, "--type", LEDGER, *options]
        if until_idle:
            args.append("--until-idle")
        s = self.settings
        full_env = {
            **os.environ,
            "STREAM_JOBS_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
            "STREAM_JOBS_DATABASE_URL": s.database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": s.database_schema,
            "STREAM_JOBS_TOPIC_PREFIX": s.topic_prefix,
            "STREAM_JOBS_TOPICS_DIR": str(s.topics_dir),
            **env,
        }
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(args, cwd=REPO, env=full_env, stdout=out,
                                    stderr=subprocess.STDOUT)
        worker = WorkerProcess(name, proc, log)
        self.started.append(worker)
        return worker

    def tails(self) -> str:
        return "\n".join(w.tail() for w in self.started)

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait(timeout=10)


@pytest.fixture
def workers(settings: Settings, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(settings, tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()


# -- the ledger's tables and what they say ----------------------------------------------


@pytest.fixture
async def db(app: App, settings: Settings) -> AsyncIterator[Any]:
    """A connection to this test's schema, with the ledger's tables created."""
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        await conn.execute(
            "CREATE TABLE deliveries (job_id text NOT NULL, pid int NOT NULL, part int, "
            "pos bigint, at timestamptz NOT NULL DEFAULT clock_timestamp())")
        await conn.execute(
            "CREATE TABLE effects (id bigserial PRIMARY KEY, job_id text NOT NULL, "
            "account text NOT NULL, seq int NOT NULL)")
        yield conn
    finally:
        await conn.close()


async def effects_count(db: Any) -> int:
    return int(await db.fetchval("SELECT count(*) FROM effects"))


async def enqueue_ledger(app: App, n: int = JOBS, *, keyed: bool = True,
                         chunk: int = 1_000) -> list[str]:
    """`n` postings over ACCOUNTS accounts, seq rising per account; key = account if keyed."""
    ids: list[str] = []
    async with app.client() as client:
        for start in range(0, n, chunk):
            jobs = []
            for i in range(start, min(start + chunk, n)):
                account = f"acct-{i % ACCOUNTS:03d}"
                jobs.append(Job(LEDGER, {"account": account, "amount": i, "seq": i // ACCOUNTS},
                                key=account if keyed else None))
            ids += await client.enqueue_many(jobs)
    assert len(set(ids)) == n
    return ids


async def wait_until(check: Callable[[], Awaitable[bool]], within_s: float, what: str,
                     workers: Workers | None = None) -> float:
    """Poll `check` until true; the seconds it took. Fails the test after `within_s`."""
    began = time.monotonic()
    while not await check():
        if time.monotonic() - began > within_s:
            pytest.fail(f"timed out after {within_s:.0f} s waiting for {what}\n"
                        + (workers.tails() if workers else ""))
        await asyncio.sleep(POLL_S)
    return time.monotonic() - began


async def effects_reach(db: Any, at_least: int, within_s: float, workers: Workers) -> int:
    seen = 0

    async def enough() -> bool:
        nonlocal seen
        seen = await effects_count(db)
        return seen >= at_least

    await wait_until(enough, within_s, f"{at_least} effects", workers)
    return seen


async def assert_exactly_once_effects(db: Any, ids: list[str], context: str = "") -> None:
    """Every job ID has exactly one row in effects: none lost, none doubled, none unknown."""
    effects = {r["job_id"]: r["n"] for r in await db.fetch(
        "SELECT job_id, count(*) AS n FROM effects GROUP BY job_id")}
    missing = [i for i in ids if i not in effects]
    doubled = {i: n for i, n in effects.items() if n != 1}
    strangers = set(effects) - set(ids)
    assert not missing, f"{len(missing)} jobs lost, e.g. {missing[:5]}{context}"
    assert not doubled, (f"{len(doubled)} jobs with duplicate effects, "
                         f"e.g. {list(doubled.items())[:5]}{context}")
    assert not strangers, f"effects for unknown job IDs: {list(strangers)[:5]}{context}"


async def assert_exactly_once(db: Any, ids: list[str]) -> dict[str, int]:
    """Exactly one effect per job ID; returns the delivery figures (duplicate deliveries
    are allowed: a redelivered job finds its dedup row and does not run again)."""
    deliveries = int(await db.fetchval("SELECT count(*) FROM deliveries"))
    redelivered = int(await db.fetchval(
        "SELECT count(*) FROM (SELECT job_id FROM deliveries GROUP BY job_id "
        "HAVING count(*) > 1) AS r"))
    figures = {"jobs": len(ids), "deliveries": deliveries,
               "duplicate_deliveries": deliveries - len(ids), "jobs_redelivered": redelivered}
    await assert_exactly_once_effects(db, ids, f" ({figures})")
    return figures


def report(name: str, figures: dict[str, Any]) -> None:
    print(f"\n[{name}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


async def group_members(settings: Settings) -> tuple[str, int]:
    """(state, member count) of the ledger's worker group."""
    return await group_state(settings, worker_group(settings.topic_prefix, LEDGER))


async def committed_offsets(settings: Settings) -> dict[int, int]:
    """The worker group's committed offset per partition of the default lane."""
    topic = lane_topic(settings.topic_prefix, LEDGER)
    async with admin_client(settings) as admin:
        offsets = await admin.list_consumer_group_offsets(
            worker_group(settings.topic_prefix, LEDGER))
    return {tp.partition: meta.offset for tp, meta in offsets.items()
            if tp.topic == topic and meta.offset >= 0}


async def assert_commits_cover_what_finished(
        db: Any, settings: Settings, partitions: int = 4
) -> tuple[dict[str, tuple[int, int]], dict[int, int]]:
    """After a drain of unkeyed jobs: the group committed exactly what finished. Returns
    (job ID -> (partition, offset) of what finished, committed offset per partition)."""
    finished = {r["job_id"]: (r["part"], r["pos"]) for r in await db.fetch(
        "SELECT DISTINCT d.job_id, d.part, d.pos FROM effects e "
        "JOIN deliveries d USING (job_id)")}
    committed = await committed_offsets(settings)
    done_at: dict[int, set[int]] = defaultdict(set)
    for part, pos in finished.values():
        done_at[part].add(pos)
    for part in range(partitions):
        prefix = 0
        while prefix in done_at[part]:
            prefix += 1
        # The commit covers exactly the finished prefix: nothing unfinished below it (no
        # loss), and no finished prefix left uncommitted (no needless redelivery).
        assert committed.get(part, 0) == prefix, (
            f"partition {part}: committed {committed.get(part)}, finished prefix {prefix}")
    # Unkeyed jobs take the slots in offset order, and the drain finishes every job it
    # started, so what finished is a prefix of each partition and the commit covers it all.
    beyond = [job for job, (part, pos) in finished.items() if pos >= committed.get(part, 0)]
    assert not beyond, f"{len(beyond)} finished jobs past the committed offsets: {beyond[:5]}"
    return finished, committed


# -- 1. kill -9 mid-run -----------------------------------------------------------------


async def test_kill_9_mid_run_loses_nothing_and_duplicates_no_effect(
        app: App, declare: Declare, db: Any, workers: Workers) -> None:
    await declare(LEDGER, partitions=4, retry_tiers=["1s"])
    ids = await enqueue_ledger(app)

    began = time.monotonic()
    first = workers.start("first")
    await effects_reach(db, 1_000, 60, workers)
    first.signal(signal.SIGKILL)
    assert await first.exited(10) == -signal.SIGKILL
    killed_at = time.monotonic()
    at_kill = await effects_count(db)
    assert at_kill < JOBS, "the worker finished before the kill: slow the handler down"

    second = workers.start("second", until_idle=True)
    rc = await second.exited(120)
    assert rc == 0, second.tail()
    figures = await assert_exactly_once(db, ids)
    report("kill -9", {"effects_at_kill": at_kill, **figures,
                       "seconds_to_kill": round(killed_at - began, 1),
                       "seconds_after_kill": round(time.monotonic() - killed_at, 1)})


# -- 2. two workers, one leaves ---------------------------------------------------------


@pytest.mark.parametrize("leave", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_the_other_worker_finishes_when_one_leaves(
        app: App, declare: Declare, db: Any, workers: Workers, settings: Settings,
        leave: signal.Signals) -> None:
    await declare(LEDGER, partitions=4, retry_tiers=["1s"])
    began = time.monotonic()
    a = workers.start("a")
    b = workers.start("b")

    async def both_in_group() -> bool:
        state, members = await group_members(settings)
        return state == "Stable" and members == 2

    # Both must hold partitions before the jobs arrive, or one might do all the work.
    await wait_until(both_in_group, 60, "both workers in the group", workers)
    ids = await enqueue_ledger(app)
    at_leave = await effects_reach(db, int(JOBS * 0.3), 60, workers)
    pids_before = {r["pid"] for r in await db.fetch("SELECT DISTINCT pid FROM deliveries")}
    assert pids_before == {a.pid, b.pid}, "both workers should have been running jobs"

    a.signal(leave)
    rc_a = await a.exited(30)
    assert rc_a == (0 if leave == signal.SIGTERM else -signal.SIGKILL), a.tail()
    left_at = time.monotonic()

    async def all_done() -> bool:
        return await effects_count(db) >= JOBS

    await wait_until(all_done, 120, f"{JOBS} effects from the remaining worker", workers)
    finish_s = time.monotonic() - left_at
    b.signal(signal.SIGTERM)
    assert await b.exited(30) == 0, b.tail()
    figures = await assert_exactly_once(db, ids)
    report(f"two workers, one {leave.name}", {
        "effects_at_leave": at_leave, **figures,
        "seconds_to_finish_after_leave": round(finish_s, 1),
        "seconds": round(time.monotonic() - began, 1)})


# -- 3. SIGTERM drains and commits what it finished -------------------------------------


async def test_sigterm_drains_and_commits_what_it_finished(
        app: App, declare: Declare, db: Any, workers: Workers, settings: Settings) -> None:
    await declare(LEDGER, partitions=4, retry_tiers=["1s"])
    # Keys = job IDs: every job is its own chain, so hundreds are dispatched and waiting
    # for one of the 16 slots while 16 run (each holding its transaction open for 50 ms).
    ids = await enqueue_ledger(app, keyed=False)
    began = time.monotonic()
    first = workers.start("first", LEDGER_SLEEP_MS="50",
                          LEDGER_CONCURRENCY=str(SIGTERM_CONCURRENCY))
    await effects_reach(db, 1_000, 60, workers)

    sigterm_at = await db.fetchval("SELECT clock_timestamp()")
    first.signal(signal.SIGTERM)
    t0 = time.monotonic()
    rc = await first.exited(GRACE_S + 20)
    drain_s = time.monotonic() - t0
    assert rc == 0, first.tail()
    # Draining lets the running jobs finish and starts no new ones, so the worker is gone
    # well within the grace period (it needs about one 50 ms job plus leaving the group).
    started_after = int(await db.fetchval(
        "SELECT count(*) FROM deliveries WHERE at > $1", sigterm_at))
    assert started_after <= 2 * SIGTERM_CONCURRENCY, (
        f"{started_after} jobs started after the SIGTERM\n{first.tail()}")
    assert drain_s < GRACE_S, f"the drain took {drain_s:.1f} s\n{first.tail()}"

    finished, committed = await assert_commits_cover_what_finished(db, settings)

    second = workers.start("second", until_idle=True)
    assert await second.exited(120) == 0, second.tail()
    figures = await assert_exactly_once(db, ids)
    counts = {r["job_id"]: r["n"] for r in await db.fetch(
        "SELECT job_id, count(*) AS n FROM deliveries GROUP BY job_id")}
    again = [job for job in finished if counts[job] != 1]
    assert not again, (
        f"{len(again)} jobs finished before the SIGTERM were delivered again: {again[:5]}")
    report("sigterm", {
        "finished_before_exit": len(finished), "committed_total": sum(committed.values()),
        "jobs_started_after_sigterm": started_after,
        "drain_seconds": round(drain_s, 2), **figures,
        "seconds": round(time.monotonic() - began, 1)})


# -- 4. per-key ordering ----------------------------------------------------------------


async def test_jobs_of_one_key_run_in_enqueue_order(app: App, declare: Declare, db: Any) -> None:
    await declare("ledger.ordered", partitions=8, retry_tiers=["1s"])
    n, accounts = 10_000, 50

    @app.job("ledger.ordered", concurrency=64)  # ordering="key", the default
    async def post(job: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO effects (job_id, account, seq) VALUES ($1, $2, $3)",
                               ctx.job_id, job["account"], job["seq"])

    began = time.monotonic()
    ids: list[str] = []
    async with app.client() as client:
        for start in range(0, n, 1_000):
            ids += await client.enqueue_many(
                Job("ledger.ordered", {"account": f"acct-{i % accounts:02d}", "amount": i,
                                       "seq": i // accounts}, key=f"acct-{i % accounts:02d}")
                for i in range(start, start + 1_000))
    worker = app.worker("ledger.ordered")
    await worker.run(until_idle=True)
    run_s = time.monotonic() - began

    await assert_exactly_once_effects(db, ids)
    rows = await db.fetch("SELECT account, seq FROM effects ORDER BY id")
    written: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        written[row["account"]].append(row["seq"])
    assert len(written) == accounts
    for account, seqs in written.items():
        assert seqs == list(range(n // accounts)), (
            f"{account}: effects out of enqueue order, first misplaced at index "
            f"{next(i for i, s in enumerate(seqs) if s != i)}")
    assert worker.outcomes["succeeded"] == n
    report("ordering", {"jobs": n, "keys": accounts, "seconds": round(run_s, 1)})

