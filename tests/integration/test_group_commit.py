"""Group commit keeps ctx.once()'s guarantee: row and effects commit together or not at all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import asyncpg
import pytest

from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import AlreadyDone, RolledBackWithOthers
from stream_jobs.settings import Settings


@pytest.fixture
async def store(settings: Settings, schema: str) -> DedupStore:
    grouped = settings.model_copy(update={"dedup_group_commit": True, "dedup_linger_ms": 20.0})
    dedup = DedupStore(grouped)
    await dedup.migrate()
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    await conn.execute("CREATE TABLE effects (job_id text NOT NULL)")
    await conn.close()
    return dedup


async def _effects(settings: Settings) -> list[str]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return sorted(r["job_id"] for r in await conn.fetch("SELECT job_id FROM effects"))
    finally:
        await conn.close()


async def test_a_careful_batch_rolls_a_failing_job_back_alone(
        store: DedupStore, settings: Settings) -> None:
    async def job(job_id: str, fail: bool) -> str:
        try:
            async with store.once(job_id, "t.x", 1, careful=True) as conn:
                await conn.execute("INSERT INTO effects VALUES ($1)", job_id)
                if fail:
                    raise RuntimeError("handler failed after writing")
        except RuntimeError:
            return "failed"
        return "ok"

    results = await asyncio.gather(*(job(f"j{i}", fail=i % 3 == 0) for i in range(30)))
    assert results.count("failed") == 10
    assert await _effects(settings) == sorted(f"j{i}" for i in range(30) if i % 3)
    assert await store.count() == 20  # the failed jobs left no dedup row either
    await store.close()


async def test_an_optimistic_batch_rolls_back_whole_and_its_bystanders_run_again(
        store: DedupStore, settings: Settings) -> None:
    """Without savepoints a failing body takes the batch down with it: the jobs that ran
    before it hear RolledBackWithOthers (nothing of theirs written), the ones after it
    move to another batch. Run again carefully, as the worker does, every job that did
    not fail has its effect once."""
    outcomes: dict[str, list[str]] = {f"j{i}": [] for i in range(30)}

    async def job(job_id: str, fail: bool, careful: bool = False) -> None:
        try:
            async with store.once(job_id, "t.x", 1, careful=careful) as conn:
                await conn.execute("INSERT INTO effects VALUES ($1)", job_id)
                if fail:
                    raise RuntimeError("handler failed after writing")
        except RuntimeError:
            outcomes[job_id].append("failed")
        except RolledBackWithOthers:
            outcomes[job_id].append("rolled back")
            await job(job_id, fail, careful=True)
        else:
            outcomes[job_id].append("ok")

    await asyncio.gather(*(job(f"j{i}", fail=i == 7) for i in range(30)))
    assert outcomes["j7"] == ["failed"]
    rolled_back = [j for j, seen in outcomes.items() if seen == ["rolled back", "ok"]]
    assert rolled_back, "j7 was alone in its batch: the test shows nothing"
    assert all(seen in (["ok"], ["rolled back", "ok"]) for j, seen in outcomes.items()
               if j != "j7"), outcomes
    assert await _effects(settings) == sorted(f"j{i}" for i in range(30) if i != 7)
    assert await store.count() == 29
    await store.close()


async def _until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until `condition` holds (no clock involved)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_a_job_that_leaves_before_its_turn_leaves_no_claim(
        settings: Settings, schema: str) -> None:
    """Claims are made for every job waiting for the connection at once: a job cancelled
    while it waits for its turn, its claim made, must not commit that claim."""
    store = DedupStore(settings.model_copy(update={"dedup_group_commit": True,
                                                    "dedup_linger_ms": 500.0}))
    await store.migrate()
    await (await store.pool()).execute("CREATE TABLE effects (job_id text NOT NULL)")
    entered = {"a": asyncio.Event(), "b": asyncio.Event()}
    gates = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def job(job_id: str) -> None:
        async with store.once(job_id, "t.x", 1) as conn:
            await conn.execute("INSERT INTO effects VALUES ($1)", job_id)
            if job_id in gates:
                entered[job_id].set()
                await gates[job_id].wait()

    a = asyncio.create_task(job("a"))
    await entered["a"].wait()  # "a" holds the connection
    b, c = asyncio.create_task(job("b")), asyncio.create_task(job("c"))
    committer = store._committer
    assert committer is not None
    await _until(lambda: sum(batch.pending for batch in committer._open) == 3)
    gates["a"].set()
    await entered["b"].wait()  # "b" has the connection: it claimed for "b" and "c"
    c.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await c
    gates["b"].set()
    await asyncio.gather(a, b)
    assert await _effects(settings) == ["a", "b"]
    assert await store.finished("c") is None  # its claim was not committed
    await store.close()


async def test_duplicates_in_one_batch_run_once(store: DedupStore, settings: Settings) -> None:
    ran: list[str] = []

    async def job(job_id: str) -> str:
        try:
            async with store.once(job_id, "t.x", 1) as conn:
                ran.append(job_id)
                await conn.execute("INSERT INTO effects VALUES ($1)", job_id)
        except AlreadyDone:
            return "duplicate"
        return "ok"

    # Quotes in an ID must survive the literal quoting of the claim.
    ids = ["a", "b", "o'brien", "a", "b", "o'brien", "c"]
    results = await asyncio.gather(*(job(i) for i in ids))
    assert results.count("ok") == 4
    assert results.count("duplicate") == 3
    assert await _effects(settings) == ["a", "b", "c", "o'brien"]
    await store.close()


async def test_once_returns_only_after_commit(store: DedupStore, settings: Settings) -> None:
    async with store.once("durable", "t.x", 1) as conn:
        await conn.execute("INSERT INTO effects VALUES ('durable')")
    # Another connection sees the effect as soon as once() has returned.
    assert await _effects(settings) == ["durable"]
    await store.close()


async def test_a_failed_commit_fails_every_job_of_the_batch(
        store: DedupStore, settings: Settings) -> None:
    async def job(job_id: str, poison: bool) -> str:
        try:
            async with store.once(job_id, "t.x", 1) as conn:
                if poison:
                    # A deferred constraint fails at COMMIT, for the whole batch.
                    await conn.execute("CREATE TEMP TABLE IF NOT EXISTS d (x int UNIQUE "
                                       "DEFERRABLE INITIALLY DEFERRED)")
                    await conn.execute("INSERT INTO d VALUES (1), (1)")
                await conn.execute("INSERT INTO effects VALUES ($1)", job_id)
        except asyncpg.PostgresError:
            return "failed"
        return "ok"

    results = await asyncio.gather(*(job(f"p{i}", poison=i == 0) for i in range(5)))
    assert results == ["failed"] * 5, results
    assert await _effects(settings) == []
    assert await store.count() == 0
    await store.close()
