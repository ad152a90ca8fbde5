"""Group commit keeps ctx.once()'s guarantee: row and effects commit together or not at all."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import AlreadyDone
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


async def test_a_failing_job_is_rolled_back_alone(store: DedupStore, settings: Settings) -> None:
    async def job(job_id: str, fail: bool) -> str:
        try:
            async with store.once(job_id, "t.x", 1) as conn:
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
