"""A handler's timeout can cancel its `ctx.once()` while the claim waits on a row lock
(a zombie worker's open transaction holds the same job ID). With group commit the claim
runs inside a batch other jobs share: the cancelled claim must leave that batch whole."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest

from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import RolledBackWithOthers
from stream_jobs.settings import Settings


@pytest.fixture
async def store(settings: Settings, schema: str) -> DedupStore:
    # A long linger, so the two jobs below share one batch.
    grouped = settings.model_copy(update={"dedup_group_commit": True,
                                          "dedup_linger_ms": 300.0})
    dedup = DedupStore(grouped)
    await dedup.migrate()
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    await conn.execute("CREATE TABLE effects (job_id text NOT NULL)")
    await conn.close()
    return dedup


@pytest.mark.parametrize("careful", [False, True])
async def test_a_claim_cancelled_by_a_timeout_leaves_its_batch_committable(
        store: DedupStore, settings: Settings, careful: bool) -> None:
    # A careful batch claims behind a savepoint and rolls back to it; an optimistic one
    # is given up whole, and the job that had run in it runs again (as the worker does).
    reran: list[str] = []
    zombie = await asyncpg.connect(settings.database_url,
                                   server_settings={"search_path": settings.database_schema})
    try:
        # Another worker's transaction holds job "b"'s dedup row, uncommitted.
        await zombie.execute("BEGIN")
        await zombie.execute("INSERT INTO stream_jobs_done (job_id, job_type, attempt) "
                             "VALUES ('b', 't.x', 1)")

        async def run(job_id: str, again: bool = False) -> None:
            try:
                async with store.once(job_id, "t.x", 1, careful=careful or again) as conn:
                    await conn.execute("INSERT INTO effects VALUES ($1)", job_id)
            except RolledBackWithOthers:
                assert not careful
                assert not again
                reran.append(job_id)
                await run(job_id, again=True)

        first = asyncio.create_task(run("a"))
        # "b" joins a's batch and its claim waits on the lock until its timeout.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run("b"), timeout=0.5)
        await zombie.execute("ROLLBACK")
        await asyncio.wait_for(first, timeout=10)
    finally:
        await zombie.close()

    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        effects = [r["job_id"] for r in await conn.fetch("SELECT job_id FROM effects")]
    finally:
        await conn.close()
    # "a" returned from once(), so its row and effect are committed; "b" left nothing.
    assert effects == ["a"]
    assert await store.finished("a") is not None
    assert await store.finished("b") is None
    assert reran == ([] if careful else ["a"])
    await store.close()


async def test_a_body_that_swallows_a_failed_statement_fails_its_batch_loudly(
        store: DedupStore, settings: Settings) -> None:
    # Postgres aborts the shared transaction when a statement fails; if the body catches
    # the error and returns, a COMMIT would quietly roll the whole batch back while every
    # job in it was acknowledged. The batch must fail instead, so its jobs retry.
    # Which body did it is not known in a batch without savepoints: every job of it hears
    # RolledBackWithOthers and runs again in a careful batch (as the worker does), where
    # the COMMIT fails loudly.
    async def run(job_id: str, swallow: bool, careful: bool = False) -> str:
        try:
            async with store.once(job_id, "t.x", 1, careful=careful) as conn:
                await conn.execute("INSERT INTO effects VALUES ($1)", job_id)
                if swallow:
                    with contextlib.suppress(asyncpg.PostgresError):
                        await conn.execute("SELECT 1 / 0")
        except asyncpg.PostgresError:
            return "failed"
        except RolledBackWithOthers:
            assert not careful
            return await run(job_id, swallow, careful=True)
        return "ok"

    results = await asyncio.gather(run("a", False), run("b", True))
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        effects = sorted(r["job_id"] for r in await conn.fetch("SELECT job_id FROM effects"))
    finally:
        await conn.close()
    # Whatever returned "ok" is durable; nothing is acknowledged and missing.
    done = [job for job, result in zip(("a", "b"), results, strict=True) if result == "ok"]
    assert effects == done
    assert results == ["failed", "failed"]
    await store.close()


async def test_without_group_commit_a_swallowed_failure_fails_the_job_too(
        settings: Settings, schema: str) -> None:
    single = DedupStore(settings.model_copy(update={"dedup_group_commit": False}))
    await single.migrate()
    async def swallowing_body() -> None:
        async with single.once("c", "t.x", 1) as conn:
            with contextlib.suppress(asyncpg.PostgresError):
                await conn.execute("SELECT 1 / 0")

    try:
        with pytest.raises(asyncpg.PostgresError):
            await swallowing_body()
        assert await single.finished("c") is None  # not acknowledged, so it runs again
    finally:
        await single.close()
