"""`ctx.once()` in memory keeps DedupStore's promise: one commit per job ID, a later run
refused before its body, a failed body leaving nothing, child jobs written only with the
parent's commit; `once_sync` commits the handler's own session with the block."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from stream_jobs.client import Job, JobClient
from stream_jobs.errors import AlreadyDone
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.outbox.rows import insert_args, insert_sql
from stream_jobs.settings import Settings
from stream_jobs.testing.memory_dedup import (
    MemoryDedup,
    MemoryTransaction,
    RawRecord,
    Statement,
    TesterTransaction,
)


class Written:
    def __init__(self) -> None:
        self.records: list[RawRecord] = []

    def __call__(self, records: Sequence[RawRecord]) -> None:
        self.records.extend(records)


def store() -> tuple[MemoryDedup, Written]:
    written = Written()
    return MemoryDedup("s", written), written


def child() -> tuple[str, object]:
    client = JobClient(Settings(), {"b": JobTypePolicy("b")})
    return client.prepare(Job("b", {"n": 1}, job_id="child-1"))


async def test_a_committed_block_keeps_its_effects_and_refuses_a_second_run() -> None:
    dedup, _ = store()
    async with dedup.once("j1", "a", 1) as conn:
        await conn.execute("INSERT INTO t VALUES ($1)", "j1")
    assert dedup.effects["j1"] == [Statement("INSERT INTO t VALUES ($1)", ("j1",))]
    assert dedup.done["j1"].attempt == 1
    ran = False
    with pytest.raises(AlreadyDone):
        async with dedup.once("j1", "a", 2):
            ran = True
    assert not ran


async def test_a_body_that_raises_leaves_nothing_and_a_retry_may_commit() -> None:
    dedup, written = store()

    async def failing() -> None:
        async with dedup.once("j1", "a", 1) as conn:
            await conn.execute("INSERT 1")
            conn.keep_outbox_rows([child()])
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await failing()
    assert "j1" not in dedup.done
    assert written.records == []
    async with dedup.once("j1", "a", 2) as conn:
        conn.keep_outbox_rows([child()])
    assert dedup.done["j1"].attempt == 2
    assert [topic for topic, *_ in written.records] == ["jobs.b"]


async def test_two_runs_of_one_id_take_turns_and_the_second_is_a_duplicate() -> None:
    dedup, _ = store()
    order: list[str] = []

    async def run(name: str) -> None:
        try:
            async with dedup.once("j1", "a", 1):
                order.append(f"{name} in")
                await asyncio.sleep(0)  # give the other a chance to barge in
                order.append(f"{name} out")
        except AlreadyDone:
            order.append(f"{name} duplicate")

    await asyncio.gather(run("first"), run("second"))
    assert order == ["first in", "first out", "second duplicate"]


async def test_a_savepoint_drops_only_what_it_recorded() -> None:
    dedup, _ = store()

    async def dropped(conn: MemoryTransaction) -> None:
        async with conn.transaction():
            await conn.execute("dropped")
            raise LookupError("the savepoint rolls back")

    async with dedup.once("j1", "a", 1) as conn:
        await conn.execute("kept")
        with pytest.raises(LookupError):
            await dropped(conn)
    assert [s.sql for s in dedup.effects["j1"]] == ["kept"]


async def test_a_deferred_block_records_and_its_outbox_statement_becomes_a_child() -> None:
    dedup, written = store()
    topic, record = child()
    async with dedup.once_deferred("j1", "a", 1) as writes:
        await writes.execute("UPDATE t SET n = n + 1")
        await writes.execute(insert_sql("s", "asyncpg"), *insert_args([(topic, record)], "s"))
    assert [s.sql for s in dedup.effects["j1"]] == ["UPDATE t SET n = n + 1"]
    [(to, key, value, headers)] = written.records
    assert (to, key, value) == ("jobs.b", b"child-1", b'{"n":1}')
    assert ("sj-job-id", b"child-1") in headers
    with pytest.raises(AlreadyDone):
        async with dedup.once_deferred("j1", "a", 2) as writes:
            await writes.execute("UPDATE t SET n = n + 1")
    assert len(dedup.effects["j1"]) == 1


def test_once_sync_commits_the_handlers_own_session_and_keeps_the_row_here() -> None:
    dedup, _ = store()
    engine = create_engine("sqlite://")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE sent (id text)"))
    with Session(engine) as session, dedup.once_sync(session, "j1", "a", 1):
        session.execute(text("INSERT INTO sent VALUES ('j1')"))

    def failing() -> None:
        with Session(engine) as session, dedup.once_sync(session, "j2", "a", 1):
            session.execute(text("INSERT INTO sent VALUES ('j2')"))
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError, match="rolled back"):
        failing()
    with Session(engine) as session:
        assert session.execute(text("SELECT id FROM sent")).scalars().all() == ["j1"]
        with pytest.raises(AlreadyDone), dedup.once_sync(session, "j1", "a", 2):
            pass
    assert set(dedup.done) == {"j1"}


async def test_fencing_tokens_only_grow() -> None:
    dedup, _ = store()
    tokens = [await dedup.fencing_token() for _ in range(3)]
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 3


async def test_a_testers_transaction_writes_its_jobs_at_the_end_or_not_at_all() -> None:
    written = Written()
    async with TesterTransaction(written) as tx:
        tx.keep_outbox_rows([child()])
        assert written.records == []
    assert len(written.records) == 1
    assert tx.committed
    failed = TesterTransaction(written)

    def failing() -> None:
        with failed:
            failed.keep_outbox_rows([child()])
            raise KeyError("dropped")

    with pytest.raises(KeyError):
        failing()
    assert len(written.records) == 1
    assert not failed.committed
