"""Deferred writes for `ctx.once_deferred()`: many jobs' claims and effects in a few round trips.

`ctx.once()` hands a body a live connection, so every statement is a round trip and every
job needs its own savepoint. Most exactly-once handlers only *write* (insert an effect
row, bump a counter); for them a body can record its statements instead, and the worker
applies many jobs' recordings together:

1. one `INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING RETURNING job_id`
   claims every job of the batch at once; jobs whose row already existed are duplicates
   and their recordings are dropped;
2. the winners' statements run with `executemany`, which asyncpg pipelines: the k-th
   statements of all jobs go together, grouped by SQL text, so each job's own statements
   still run in the order it recorded them (a `ColumnStatement` goes as one statement
   over arrays instead: a finish's result rows and batch counters);
3. one COMMIT. A job is finished only when its batch committed.

The guarantee is `ctx.once()`'s: a job's dedup row and its effects commit together or
not at all. If a statement fails, the whole transaction rolls back and each job of the
batch is applied again alone, so only the job whose statement fails sees the error (and
goes through its retry tiers). If Postgres is unreachable or the commit fails, every job
of the batch gets the error and retries; a retry after a commit that did land finds its
row and is acknowledged as a duplicate. Two jobs with the same ID never share a batch:
the second waits for the first's outcome.

A body cannot read through a recording: what it needs to read, it reads elsewhere first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import asyncpg

from stream_jobs.postgres.names import named

CLAIM_MANY = (
    "INSERT INTO stream_jobs_done (job_id, job_type, attempt) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::int[]) "
    "ON CONFLICT (job_id) DO NOTHING RETURNING job_id"
)

Statement = tuple[str, tuple[Any, ...]]


class ColumnStatement(str):
    """A runtime statement (its text is the one-job statement) that also comes as `many`:
    the same statement for any number of jobs, its k-th parameter an array of every job's k-th
    argument. A batch runs `many` once instead of the one-job statement per job, so rows
    that every job updates (a batch's counters) change once per batch, not once per job."""

    many: str

    def __new__(cls, one: str, many: str, name: str) -> ColumnStatement:
        statement = super().__new__(cls, named(one, name))
        statement.many = many
        return statement


class DeferredWrites:
    """What a `ctx.once_deferred()` body writes through: statements recorded in order,
    applied with the job's dedup row when its batch commits."""

    __slots__ = ("closed", "statements")

    def __init__(self) -> None:
        self.statements: list[Statement] = []
        # Set when the block ends: a statement recorded later would never be applied.
        self.closed = False

    async def execute(self, sql: str, *args: Any) -> None:
        """Record one statement (asyncpg placeholders `$1, $2, ...`)."""
        if self.closed:
            raise RuntimeError("this ctx.once_deferred() block has ended: a statement "
                               "recorded now would never be applied")
        if not isinstance(sql, str) or not sql.strip():
            raise TypeError("a deferred statement is SQL text, e.g. 'INSERT ... VALUES ($1)'")
        self.statements.append((sql, args))

    async def executemany(self, sql: str, args: Iterable[Sequence[Any]]) -> None:
        """Record one statement per argument tuple."""
        for row in args:
            await self.execute(sql, *row)


class DeferredBlock:
    """`async with ctx.once_deferred() as writes:`: the body records into `writes`; when it
    ends without an error, `_apply` hands the recording to the store. A body that raised
    applies nothing. Stores subclass it (a class, not a generator: it runs once per job on
    the hot path)."""

    __slots__ = ("_attempt", "_job_id", "_job_type", "_writes")

    def __init__(self, job_id: str, job_type: str, attempt: int) -> None:
        self._job_id = job_id
        self._job_type = job_type
        self._attempt = attempt
        self._writes = DeferredWrites()

    @property
    def writes(self) -> DeferredWrites:
        """What the body records into (`ctx.enqueue` records child jobs here too)."""
        return self._writes

    async def __aenter__(self) -> DeferredWrites:
        return self._writes

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._writes.closed = True
        if exc_type is None:
            await self._apply(self._writes.statements)

    async def _apply(self, statements: list[Statement]) -> None:
        """Apply this job's dedup row and `statements` as one, or raise AlreadyDone."""
        raise NotImplementedError


@dataclass(slots=True, eq=False)
class _Claim:
    job_id: str
    job_type: str
    attempt: int
    statements: list[Statement]
    # What the job awaits. Cancelled with the job (its timeout), which leaves the batch
    # alone: if the batch commits anyway, the job's retry finds the row (a duplicate).
    waiter: asyncio.Future[bool]
    # Made only when a job with the same ID waits for this claim to be settled.
    settled: asyncio.Future[None] | None = None


def stages(statements_per_job: Sequence[Sequence[Statement]]
           ) -> list[list[tuple[str, list[tuple[Any, ...]]]]]:
    """The k-th statements of all jobs form stage k; within a stage, statements with the
    same SQL text go together (first appearance first). Running the stages in order keeps
    each job's statements in its own order. Pure, for `executemany`."""
    depth = max((len(s) for s in statements_per_job), default=0)
    result: list[list[tuple[str, list[tuple[Any, ...]]]]] = []
    for k in range(depth):
        groups: dict[str, list[tuple[Any, ...]]] = {}
        for statements in statements_per_job:
            if k < len(statements):
                sql, args = statements[k]
                groups.setdefault(sql, []).append(args)
        result.append(list(groups.items()))
    return result


def _per_job_error(exc: BaseException) -> bool:
    """An error that one job's statement can cause (a constraint, a type, a syntax error),
    as opposed to one that every job of the batch would meet (no connection, shutdown)."""
    return isinstance(exc, asyncpg.PostgresError) and not isinstance(
        exc, (asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError,
              asyncpg.exceptions.InsufficientResourcesError))


class WriteBatcher:
    """Applies claims in batches, at most `parallel` transactions at a time: a claim that
    finds a transaction slot free starts a batch at once; claims that come while every
    slot is busy wait together and go as one batch (up to `batch_max`) when one frees.
    So a lone job waits for nobody, and under load batches grow by themselves."""

    def __init__(self, pool: asyncpg.Pool, *, batch_max: int, parallel: int) -> None:
        self._pool = pool
        self._batch_max = batch_max
        self._parallel = parallel
        self._active = 0
        self._pending: list[_Claim] = []
        self._waiting: dict[str, _Claim] = {}
        self._flushes: set[asyncio.Task[None]] = set()
        # Connections between batches, at most `parallel`, held from the pool.
        self._idle: list[Any] = []

    async def apply(self, job_id: str, job_type: str, attempt: int,
                    statements: list[Statement]) -> bool:
        """Claim the job and apply its statements with its batch: True once committed,
        False if the job had already finished (nothing of it was applied)."""
        loop = asyncio.get_running_loop()
        while (earlier := self._waiting.get(job_id)) is not None:
            if earlier.settled is None:
                earlier.settled = loop.create_future()
            await asyncio.wait([earlier.settled])
        claim = _Claim(job_id, job_type, attempt, statements, loop.create_future())
        self._waiting[job_id] = claim
        self._pending.append(claim)
        self._start_batches()
        return await claim.waiter

    def _settle(self, claim: _Claim, applied: bool, error: BaseException | None) -> None:
        if self._waiting.get(claim.job_id) is claim:
            del self._waiting[claim.job_id]
        if claim.settled is not None:
            claim.settled.set_result(None)
        if claim.waiter.done():
            return  # its job was cancelled: nobody to tell
        if error is not None:
            claim.waiter.set_exception(error)
        else:
            claim.waiter.set_result(applied)

    def _start_batches(self) -> None:
        while self._pending and self._active < self._parallel:
            batch = self._pending[:self._batch_max]
            del self._pending[:self._batch_max]
            self._active += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _run(self, batch: list[_Claim]) -> None:
        try:
            await self._apply(batch)
        finally:
            self._active -= 1
            self._start_batches()

    async def _apply(self, batch: list[_Claim]) -> None:
        try:
            won = await self._write(batch)
        except Exception as exc:
            if len(batch) > 1 and _per_job_error(exc):
                for claim in batch:  # find the job whose statement fails; the rest commit
                    await self._apply([claim])
                return
            for claim in batch:
                self._settle(claim, False, exc)
        except BaseException as exc:
            for claim in batch:
                self._settle(claim, False, exc)
            raise
        else:
            for claim in batch:
                self._settle(claim, claim.job_id in won, None)

    async def _write(self, batch: list[_Claim]) -> set[str]:
        conn = self._idle.pop() if self._idle else await self._pool.acquire()
        try:
            async with conn.transaction():
                rows = await conn.fetch(CLAIM_MANY, [c.job_id for c in batch],
                                        [c.job_type for c in batch],
                                        [c.attempt for c in batch])
                won = {row[0] for row in rows}
                for stage in stages([c.statements for c in batch if c.job_id in won]):
                    for sql, rows_args in stage:
                        if isinstance(sql, ColumnStatement) and len(rows_args) > 1:
                            await conn.execute(sql.many, *map(list, zip(*rows_args, strict=True)))
                        else:
                            await conn.executemany(str(sql), rows_args)
        except BaseException:
            await self._pool.release(conn)  # the pool resets it, or drops a broken one
            raise
        # Kept for the next batch: only our own statements ran on it, so it needs none of
        # the reset (a round trip) that a release to the pool costs.
        self._idle.append(conn)
        return won

    async def close(self) -> None:
        """Wait for every batch in flight (and those still waiting for a slot)."""
        while self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        while self._idle:
            await self._pool.release(self._idle.pop())
