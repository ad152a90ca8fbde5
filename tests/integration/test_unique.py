"""Unique jobs and debounce on the real stack: two producer processes racing on the same
keys (exactly one job sent and run per key and window), keys given back whatever the
outcome, a key taken in a caller's transaction that rolls back, and a debounced burst
that runs once with the last payload.

Nothing waits by sleeping: waits poll a condition against a deadline, or drain the
worker with `run(until_idle=True)`, whose relay holds a debounced job until its window
ends.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from stream_jobs.app import App
from stream_jobs.cancels.rules import CancelAnswer
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from stream_jobs.testing import JobTester
from stream_jobs.unique.rules import Enqueued
from tests.integration.cli_env import settings_env
from tests.integration.database import fetch_rows

from .conftest import Declare

ROOT = Path(__file__).resolve().parents[2]


async def _race(settings: Settings, job_type: str, mode: str, n: int, keys: int,
                window_s: float) -> list[dict[str, Any]]:
    """Two producer processes, started together, making n enqueues each on `keys` keys."""
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.apps.keyed_producer", job_type, mode, str(n), str(keys),
        str(window_s), name, cwd=ROOT, env=settings_env(settings),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        for name in ("a", "b")]
    for proc in procs:  # both connected: then both start at once
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    lines: list[dict[str, Any]] = []
    for proc in procs:
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0
        lines += [orjson.loads(line) for line in out.splitlines()]
    return lines


async def _drain(app: App, job_type: str) -> Worker:
    """Move the outbox's rows to Kafka (unique and debounced jobs go through it), then
    run a worker of `job_type` until it is idle; the worker."""
    async with OutboxRelay(app.settings) as relay:
        await relay.drain()
    worker = app.worker(job_type)
    await asyncio.wait_for(worker.run(until_idle=True), 120)
    return worker


async def test_two_producers_racing_on_unique_keys_send_one_job_per_key(
        app: App, declare: Declare) -> None:
    keys = 10
    await declare("unique.race", partitions=3, retry_tiers=["1s"])
    ran: Counter[str] = Counter()

    @app.job("unique.race")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        ran[ctx.job_id] += 1

    answers = await _race(app.settings, "unique.race", "unique", 500, keys, 3600)
    sent = [a for a in answers if a["sent"]]
    holder = {a["key"]: a["job_id"] for a in sent}
    print(f"\n[unique race] {len(answers)} enqueues, {len(sent)} sent, by producer "
          f"{dict(Counter(a['producer'] for a in sent))}")
    assert len(answers) == 1_000
    assert sorted(holder) == [f"k{i}" for i in range(keys)]
    assert len(sent) == keys  # one per key, whichever producer won it
    assert all(a["job_id"] == holder[a["key"]] for a in answers)  # the others got its ID
    await _drain(app, "unique.race")
    assert ran == Counter({job_id: 1 for job_id in holder.values()})
    # Finished, but within unique_for: still held.
    async with app.client() as client:
        again = await client.enqueue("unique.race", {}, unique_key="k3", unique_for=3600)
    assert not again.sent
    assert again == holder["k3"]


async def test_a_unique_key_is_given_back_whatever_the_outcome(app: App,
                                                               declare: Declare) -> None:
    """Without unique_for a key is held while its job is pending only: after success, a
    dead letter, a cancel or an expiry, the next enqueue of the key is sent."""
    await declare("unique.outcomes", partitions=1, retry_tiers=["1s"], max_attempts=1)

    @app.job("unique.outcomes")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        if job["kind"] == "fail":
            raise PermanentError("for the test")

    async with app.client() as client:
        first = {kind: await client.enqueue("unique.outcomes", {"kind": kind},
                                            unique_key=kind,
                                            expires_in=0.001 if kind == "expire" else None)
                 for kind in ("ok", "fail", "cancel", "expire")}
        assert all(e.sent for e in first.values())
        pending = await client.enqueue("unique.outcomes", {"kind": "ok"}, unique_key="ok")
        assert not pending.sent
        assert pending == first["ok"]  # held while pending
        cancelled = await client.cancel(first["cancel"])
        assert cancelled.answer is CancelAnswer.CANCELLED
        worker = await _drain(app, "unique.outcomes")
        assert dict(worker.outcomes) == {"succeeded": 1, "dead_lettered": 1, "cancelled": 1,
                                         "expired": 1}
        second = {kind: await client.enqueue("unique.outcomes", {"kind": "ok"},
                                             unique_key=kind) for kind in first}
    assert {kind: e.sent for kind, e in second.items()} == dict.fromkeys(first, True)
    assert all(second[kind] != first[kind] for kind in first)


async def test_a_key_taken_in_a_transaction_that_rolls_back_is_not_taken(
        app: App, declare: Declare) -> None:
    await declare("unique.tx", partitions=1, retry_tiers=["1s"])
    settings = app.settings
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with app.client() as client:
            tx = conn.transaction()
            await tx.start()
            rolled = await client.enqueue("unique.tx", {}, unique_key="once", conn=conn)
            assert rolled.sent
            await tx.rollback()
            async with conn.transaction():
                kept = await client.enqueue("unique.tx", {}, unique_key="once", conn=conn)
                inside = await client.enqueue("unique.tx", {}, unique_key="once", conn=conn)
    finally:
        await conn.close()
    assert kept.sent
    assert kept != rolled
    assert not inside.sent  # the same transaction's second try finds the key taken
    assert inside == kept
    outbox = await fetch_rows(settings, "SELECT headers FROM stream_jobs_outbox")
    assert len(outbox) == 1  # the rolled-back job was never written


async def test_a_debounced_burst_runs_once_with_the_last_payload(app: App,
                                                                declare: Declare) -> None:
    await declare("debounce.burst", partitions=2, retry_tiers=["1s", "5s"])
    ran: list[tuple[str, int]] = []

    @app.job("debounce.burst")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        ran.append((ctx.key or "", job["n"]))

    async with app.client() as client:
        got = [await client.enqueue("debounce.burst", {"n": n}, key="doc-1", debounce="2s")
               for n in range(30)]
        other = await client.enqueue("debounce.burst", {"n": 100}, key="doc-2", debounce="2s")
    assert got[0].superseded is None
    assert [g.superseded for g in got[1:]] == [str(g) for g in got[:-1]]  # each replaced the last
    assert len({g.not_before_ms for g in got}) == 1  # one window, opened by the first
    assert other.superseded is None
    worker = await _drain(app, "debounce.burst")
    assert sorted(ran) == [("doc-1", 29), ("doc-2", 100)]
    assert dict(worker.outcomes) == {"succeeded": 2, "superseded": 29}


async def test_two_producers_racing_on_debounced_keys_run_one_job_per_key_and_window(
        app: App, declare: Declare) -> None:
    keys = 5
    await declare("debounce.race", partitions=3, retry_tiers=["1s", "5s"])
    ran: list[str] = []

    @app.job("debounce.race")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    answers = await _race(app.settings, "debounce.race", "debounce", 500, keys, 3)
    windows: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for a in answers:
        windows[(a["key"], a["not_before_ms"])].append(a)
    superseded = {a["superseded"] for a in answers if a["superseded"]}
    # In each window, the one job no later enqueue replaced: the window's last.
    last = {w: [a["job_id"] for a in group if a["job_id"] not in superseded]
            for w, group in windows.items()}
    print(f"\n[debounce race] {len(answers)} enqueues in {len(windows)} windows on {keys} keys")
    assert len(answers) == 1_000
    assert all(len(ids) == 1 for ids in last.values()), last
    worker = await _drain(app, "debounce.race")
    assert sorted(ran) == sorted(ids[0] for ids in last.values())
    assert worker.outcomes["superseded"] == 1_000 - len(windows)
    marked = await fetch_rows(app.settings, "SELECT job_id FROM stream_jobs_superseded")
    assert {r["job_id"] for r in marked} == superseded


async def test_the_job_tester_on_postgres_runs_unique_and_debounced_jobs(
        settings: Settings, schema: str) -> None:
    """JobTester with `database_url=`: the keys in the real tables, the jobs through the
    real outbox into the in-memory broker; a window ends by Postgres' clock and is
    waited for on the tester's virtual one."""
    app = App(settings)
    ran: list[int] = []

    @app.job("tester.keyed")
    async def work(job: dict[str, int], ctx: JobContext) -> None:
        ran.append(job["n"])

    types: dict[str, Any] = {"tester.keyed": {"partitions": 2, "retry_tiers": ["1s", "1m"]}}
    async with JobTester(app, types=types, database_url=settings.database_url,
                         database_schema=schema) as t:
        first = await t.enqueue("tester.keyed", {"n": 1}, unique_key="once")
        held = await t.enqueue("tester.keyed", {"n": 2}, unique_key="once")
        for n in (10, 11, 12):
            await t.enqueue("tester.keyed", {"n": n}, key="doc", debounce="1s")
        await t.run_until_idle()
    assert isinstance(first, Enqueued)
    assert first.sent
    assert isinstance(held, Enqueued)
    assert not held.sent
    assert held == first
    assert sorted(ran) == [1, 12]
    assert t.outcomes["superseded"] == 2
