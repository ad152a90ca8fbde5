"""`ctx.once()` without Postgres: the dedup rows, effects and outbox rows of a `JobTester`.

`MemoryDedup` keeps the promise of `DedupStore`: a job ID's block commits at most once;
a later run of the same ID is refused before its body runs (`AlreadyDone`, the outcome
`duplicate`); two runs of one ID at the same moment take turns; a body that raises
leaves nothing behind. What a block "writes" is recorded: the connection `once()` yields
is a `MemoryTransaction`, whose `execute` keeps each statement and whose reads answer
nothing (a handler that reads needs the tester on Postgres). On commit the job's
statements become its effects (`JobTester.effects_of`), and the child jobs it enqueued
(`ctx.enqueue`, kept as outbox rows) are written to the broker, so they exist if and only
if the parent committed. `once_deferred()` records the same way; `once_sync(session)`
keeps the dedup row here and commits the handler's own session (SQLAlchemy or DB-API,
e.g. on SQLite) with the block.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from stream_jobs import clock
from stream_jobs.dedup.deferred import DeferredWrites
from stream_jobs.dedup.sync_once import done_table, transaction_of
from stream_jobs.errors import AlreadyDone
from stream_jobs.outbox.rows import decode_headers, insert_sql

S = TypeVar("S")
# (topic, key, value, headers): a record to write once its transaction commits.
RawRecord = tuple[str, bytes | None, bytes | None, Sequence[tuple[str, bytes]]]
Publish = Callable[[Sequence[RawRecord]], None]


@dataclass(frozen=True)
class Statement:
    """One statement a handler ran through its `once()` connection, and its arguments."""

    sql: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class DoneRow:
    """A committed dedup row: the attempt that committed it, and when (virtual Unix ms)."""

    job_type: str
    attempt: int
    finished_at_ms: int


class MemoryTransaction:
    """A transaction without a database: statements are recorded, reads answer nothing,
    and the outbox rows an `enqueue(conn=...)` writes are kept until it commits.

    `once()` yields one per job. `JobTester.transaction()` gives one for the caller's own
    `enqueue(conn=...)`: its jobs are written when the block ends without an error.
    """

    def __init__(self) -> None:
        self.statements: list[Statement] = []
        self.outbox: list[RawRecord] = []
        self._lock = threading.Lock()

    # asyncpg's keyword options (`timeout=`, `column=`) are taken and mean nothing here.
    async def execute(self, sql: str, *args: Any, **options: Any) -> str:
        self.statements.append(Statement(sql, args))
        return "EXECUTE 0"

    async def executemany(self, sql: str, args: Sequence[Sequence[Any]],
                          **options: Any) -> None:
        for row in args:
            self.statements.append(Statement(sql, tuple(row)))

    async def fetch(self, sql: str, *args: Any, **options: Any) -> list[Any]:
        self.statements.append(Statement(sql, args))
        return []

    async def fetchrow(self, sql: str, *args: Any, **options: Any) -> None:
        self.statements.append(Statement(sql, args))

    async def fetchval(self, sql: str, *args: Any, **options: Any) -> None:
        self.statements.append(Statement(sql, args))

    def is_in_transaction(self) -> bool:
        return True

    def transaction(self) -> _Savepoint:
        """A nested block: what it recorded is dropped if it raises (a savepoint)."""
        return _Savepoint(self)

    def keep_outbox_rows(self, records: Sequence[tuple[str, Any]]) -> None:
        """`enqueue(conn=...)` and `ctx.enqueue` write here (`OutboxStandIn`)."""
        with self._lock:
            self.outbox.extend((topic, rec.key, rec.payload, rec.headers())
                               for topic, rec in records)


class TesterTransaction(MemoryTransaction):
    """`JobTester.transaction()`: a `MemoryTransaction` whose block (`async with` or
    `with`) commits at its end, writing the jobs enqueued through it; an error in the
    block drops them."""

    __test__ = False  # not a test class, whatever pytest's name rules say

    def __init__(self, publish: Publish) -> None:
        super().__init__()
        self._publish = publish
        self.committed = False

    def _end(self, failed: bool) -> None:
        if failed:
            self.outbox.clear()
            return
        self.committed = True
        rows, self.outbox = self.outbox, []
        if rows:
            self._publish(rows)

    async def __aenter__(self) -> TesterTransaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._end(exc_type is not None)

    def __enter__(self) -> TesterTransaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._end(exc_type is not None)


class _Savepoint:
    def __init__(self, tx: MemoryTransaction) -> None:
        self._tx = tx
        self._marks = (0, 0)

    async def __aenter__(self) -> MemoryTransaction:
        self._marks = (len(self._tx.statements), len(self._tx.outbox))
        return self._tx

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            del self._tx.statements[self._marks[0]:]
            del self._tx.outbox[self._marks[1]:]


class MemoryDedup:
    """A `Dedup` in memory (see the module). `publish` writes committed outbox rows."""

    def __init__(self, schema: str, publish: Publish) -> None:
        self._schema = schema
        self._publish = publish
        self.done: dict[str, DoneRow] = {}
        self.effects: dict[str, list[Statement]] = {}
        # job ID -> (the lock its runs take turns on, runs holding or waiting for it)
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}
        self._thread_turns: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._tokens = itertools.count(1)
        self.tokens_issued = 0

    @property
    def table(self) -> str:
        return done_table(self._schema)

    @asynccontextmanager
    async def once(self, job_id: str, job_type: str, attempt: int) -> AsyncIterator[Any]:
        turn, waiting = self._turns.get(job_id, (asyncio.Lock(), 0))
        self._turns[job_id] = (turn, waiting + 1)
        try:
            async with turn:
                if job_id in self.done:
                    raise AlreadyDone(f"job {job_id} already finished")
                tx = MemoryTransaction()
                yield tx
                self._commit(job_id, job_type, attempt, tx.statements, tx.outbox)
        finally:
            turn, waiting = self._turns[job_id]
            if waiting > 1:
                self._turns[job_id] = (turn, waiting - 1)
            else:
                del self._turns[job_id]

    def once_deferred(
            self, job_id: str, job_type: str, attempt: int, *,
            while_waiting: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> _DeferredBlock:
        return _DeferredBlock(self, job_id, job_type, attempt)

    @contextmanager
    def once_sync(self, session: S, job_id: str, job_type: str, attempt: int) -> Iterator[S]:
        with self._guard:
            turn = self._thread_turns.setdefault(job_id, threading.Lock())
        with turn:
            if job_id in self.done:
                raise AlreadyDone(f"job {job_id} already finished")
            # The session's own commit and rollback; the dedup row is kept here.
            tx = transaction_of(session, self.table, (job_id, job_type, attempt))
            try:
                yield session
            except BaseException:
                tx.rollback_quietly()
                raise
            tx.commit()
            self._commit(job_id, job_type, attempt, [], [])

    def fencing_token(self) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with self._guard:
            future.set_result(next(self._tokens))
            self.tokens_issued += 1
        return future

    async def close(self) -> None:
        pass

    def _commit(self, job_id: str, job_type: str, attempt: int,
                statements: Sequence[Statement], outbox: Sequence[RawRecord]) -> None:
        with self._guard:
            if job_id in self.done:  # lost a race with another thread's commit
                raise AlreadyDone(f"job {job_id} already finished")
            self.done[job_id] = DoneRow(job_type, attempt, clock.now_ms())
            self.effects[job_id] = list(statements)
        if outbox:
            self._publish(outbox)

    def outbox_rows(self, statements: Sequence[tuple[str, tuple[Any, ...]]]
                    ) -> tuple[list[Statement], list[RawRecord]]:
        """Split recorded `(sql, args)` into effects and the outbox rows among them (the
        statement `ctx.enqueue` records inside `once_deferred()`)."""
        outbox_sql = insert_sql(self._schema, "asyncpg")
        effects: list[Statement] = []
        rows: list[RawRecord] = []
        for sql, args in statements:
            if sql != outbox_sql:
                effects.append(Statement(sql, tuple(args)))
                continue
            topics, keys, values, headers = args[:4]
            rows.extend((topic, key, value, decode_headers(pairs))
                        for topic, key, value, pairs in zip(topics, keys, values, headers,
                                                            strict=True))
        return effects, rows


class _DeferredBlock:
    """`async with ctx.once_deferred() as writes:` on a `MemoryDedup`."""

    def __init__(self, store: MemoryDedup, job_id: str, job_type: str, attempt: int) -> None:
        self._store = store
        self._job_id = job_id
        self._job_type = job_type
        self._attempt = attempt
        self._writes = DeferredWrites()

    @property
    def writes(self) -> DeferredWrites:
        return self._writes

    async def __aenter__(self) -> DeferredWrites:
        return self._writes

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._writes.closed = True
        if exc_type is not None:
            return  # the body failed: nothing it recorded is applied
        store = self._store
        if self._job_id in store.done:
            raise AlreadyDone(f"job {self._job_id} already finished")
        effects, rows = store.outbox_rows(self._writes.statements)
        store._commit(self._job_id, self._job_type, self._attempt, effects, rows)


__all__ = ["DoneRow", "MemoryDedup", "MemoryTransaction", "Statement", "TesterTransaction"]
