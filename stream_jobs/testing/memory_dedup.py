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

The rows live in a `MemoryTables` (`memory_tables`), which also carries out the runtime's
own statements among what a transaction ran: a batch or chain made inside the block, and
the finish of a job that keeps its result or belongs to a workflow (`hold`,
`apply_deferred`, `execute`: the `FinishStore` of `stream_jobs.results.finish`).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from stream_jobs.dedup.deferred import DeferredBlock
from stream_jobs.dedup.deferred import Statement as DeferredStatement
from stream_jobs.dedup.sync_once import done_table, transaction_of
from stream_jobs.errors import AlreadyDone, ConfigError
from stream_jobs.results.rules import StoredResult
from stream_jobs.testing.memory_tables import DoneRow, MemoryTables, RawRecord
from stream_jobs.unique.claim import KeyAnswer
from stream_jobs.unique.rules import KeyClaim

S = TypeVar("S")
Publish = Callable[[Sequence[RawRecord]], None]


@dataclass(frozen=True)
class Statement:
    """One statement a handler ran through its `once()` connection, and its arguments."""

    sql: str
    args: tuple[Any, ...]


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
    `with`) commits at its end, writing the jobs enqueued through it (and the batches and
    chains made through it); an error in the block drops them."""

    __test__ = False  # not a test class, whatever pytest's name rules say

    def __init__(self, publish: Publish, tables: MemoryTables | None = None) -> None:
        super().__init__()
        self._publish = publish
        self._tables = tables
        self._undo: list[Callable[[], None]] = []  # the keys taken, given back on rollback
        self.committed = False

    def take_key(self, claim: KeyClaim, job_type: str, job_id: str) -> KeyAnswer:
        """A unique or debounced `enqueue(conn=...)`: the key is taken now, as Postgres
        would lock its row, and given back if the block fails."""
        if self._tables is None:
            raise ConfigError("This transaction has no rows to take a unique key in: use "
                              "JobTester.transaction().")
        return self._tables.take_key(claim, job_type, job_id, self._undo)

    def _end(self, failed: bool) -> None:
        if failed:
            self.outbox.clear()
            for restore in reversed(self._undo):
                restore()
            return
        self.committed = True
        written: list[RawRecord] = []
        if self._tables is not None:
            _, written = self._tables.commit(None, [(st.sql, st.args) for st in self.statements])
        rows, self.outbox = [*self.outbox, *written], []
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

    def __init__(self, schema: str, publish: Publish, tables: MemoryTables | None = None
                 ) -> None:
        self._schema = schema
        self._publish = publish
        self.tables = tables or MemoryTables(schema)
        self.effects: dict[str, list[Statement]] = {}
        # job ID -> (the lock its runs take turns on, runs holding or waiting for it)
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}
        self._thread_turns: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._tokens = itertools.count(1)
        self.tokens_issued = 0

    @property
    def done(self) -> dict[str, DoneRow]:
        return self.tables.done

    @property
    def table(self) -> str:
        return done_table(self._schema)

    @asynccontextmanager
    async def _turn(self, job_id: str) -> AsyncIterator[None]:
        """Runs of one job ID take turns, as they would on its dedup row's lock."""
        turn, waiting = self._turns.get(job_id, (asyncio.Lock(), 0))
        self._turns[job_id] = (turn, waiting + 1)
        try:
            async with turn:
                yield
        finally:
            turn, waiting = self._turns[job_id]
            if waiting > 1:
                self._turns[job_id] = (turn, waiting - 1)
            else:
                del self._turns[job_id]

    @asynccontextmanager
    async def once(self, job_id: str, job_type: str, attempt: int, *,
                   careful: bool = False) -> AsyncIterator[Any]:
        async with self._turn(job_id):
            tx = MemoryTransaction()
            self.tables.claim(job_id)  # before the look: a cancel now waits for the block
            try:
                if job_id in self.done:
                    raise AlreadyDone(f"job {job_id} already finished")
                yield tx
                self.commit(job_id, job_type, attempt, tx)
            finally:
                self.tables.release(job_id)

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
            self.tables.claim(job_id)
            try:
                if job_id in self.done:
                    raise AlreadyDone(f"job {job_id} already finished")
                # The session's own commit and rollback; the dedup row is kept here.
                tx = transaction_of(session, self.table, (job_id, job_type, attempt))
                try:
                    yield session
                except BaseException:
                    tx.rollback_quietly()
                    raise
                with self.tables.lock:  # the session and the row commit as one
                    if job_id in self.done:  # another thread's run of the ID got there
                        tx.rollback_quietly()
                        raise AlreadyDone(f"job {job_id} already finished")
                    tx.commit()
                    self.tables.commit((job_id, job_type, attempt), [])
            finally:
                self.tables.release(job_id)
            self.effects[job_id] = []

    def fencing_token(self) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with self._guard:
            future.set_result(next(self._tokens))
            self.tokens_issued += 1
        return future

    async def close(self) -> None:
        pass

    def commit(self, job_id: str, job_type: str, attempt: int, tx: MemoryTransaction,
               statements: Sequence[tuple[str, Any]] = ()) -> None:
        """The job's dedup row, what `tx` ran and `statements`, in one transaction; its
        child jobs are written once it committed. `AlreadyDone` if the row existed."""
        ran = [*((st.sql, st.args) for st in tx.statements), *statements]
        effects, rows = self.tables.commit((job_id, job_type, attempt), ran)
        self.effects[job_id] = [Statement(sql, args) for sql, args in effects]
        written = [*tx.outbox, *rows]
        if written:
            self._publish(written)

    # -- the finish of a job (stream_jobs.results.finish.FinishStore) ----------------------

    async def hold(self, job_id: str, job_type: str, attempt: int) -> MemoryHeld:
        held = MemoryHeld(self, job_id, job_type, attempt, self._turn(job_id))
        await held.begin()
        return held

    async def apply_deferred(self, job_id: str, job_type: str, attempt: int,
                             statements: list[tuple[str, tuple[Any, ...]]],
                             while_waiting: Callable[[], AbstractContextManager[None]] | None
                             = None) -> bool:
        try:
            self.commit(job_id, job_type, attempt, MemoryTransaction(), statements)
        except AlreadyDone:
            return False
        return True

    async def execute(self, sql: str, *args: Any) -> None:
        """One statement in a transaction of its own (a job's terminal result row)."""
        _, rows = self.tables.commit(None, [(sql, args)])
        if rows:
            self._publish(rows)

    async def result_of(self, job_id: str) -> StoredResult | None:
        return self.tables.result_of(job_id)


class MemoryHeld:
    """`HeldTransaction` in memory: the job's turn is taken and its row checked when it
    begins; its statements and the row commit together, or nothing does."""

    def __init__(self, store: MemoryDedup, job_id: str, job_type: str, attempt: int,
                 turn: AbstractAsyncContextManager[None]) -> None:
        self._store = store
        self._job = (job_id, job_type, attempt)
        self._turn: AbstractAsyncContextManager[None] | None = turn
        self.conn: MemoryTransaction = MemoryTransaction()

    async def begin(self) -> None:
        assert self._turn is not None
        await self._turn.__aenter__()
        self._store.tables.claim(self._job[0])
        if self._job[0] in self._store.done:
            await self.rollback()
            raise AlreadyDone(f"job {self._job[0]} already finished")

    async def execute(self, sql: str, *args: Any) -> None:
        await self.conn.execute(sql, *args)

    async def commit(self) -> None:
        try:
            self._store.commit(*self._job, self.conn)
        finally:
            await self._end()

    async def rollback(self) -> None:
        await self._end()

    async def _end(self) -> None:
        turn, self._turn = self._turn, None
        if turn is not None:
            self._store.tables.release(self._job[0])
            await turn.__aexit__(None, None, None)


class _DeferredBlock(DeferredBlock):
    """`async with ctx.once_deferred() as writes:` on a `MemoryDedup`."""

    __slots__ = ("_store",)

    def __init__(self, store: MemoryDedup, job_id: str, job_type: str, attempt: int) -> None:
        super().__init__(job_id, job_type, attempt)
        self._store = store

    async def _apply(self, statements: list[DeferredStatement]) -> None:
        self._store.commit(self._job_id, self._job_type, self._attempt, MemoryTransaction(),
                           statements)


__all__ = ["DoneRow", "MemoryDedup", "MemoryHeld", "MemoryTransaction", "Statement",
           "TesterTransaction"]
