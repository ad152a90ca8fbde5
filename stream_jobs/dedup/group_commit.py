"""Group commit for `ctx.once()`: many jobs' dedup rows and effects in one transaction.

Committing a transaction costs a WAL flush, so one transaction per job caps a worker at a
few hundred jobs a second. A `CommitBatch` is one open transaction on one connection
that jobs join for a short linger (or until it holds `batch_max` jobs):

- each job runs its dedup insert and its effects inside its own SAVEPOINT, one job at a
  time on the batch's connection (a lock), so a job whose body fails is rolled back alone;
- a job whose dedup row exists (an earlier run committed) releases its savepoint and is
  acknowledged as a duplicate without running;
- `once()` returns only after the whole batch COMMITs, so a job is marked finished only
  once its row and effects are durable. If the commit fails, every job of the batch gets
  the error and goes through its retry tiers: nothing was written for any of them.

The guarantee is the same as one transaction per job: the row and the effects commit
together or not at all. Two jobs with the same ID never share a batch: the second waits
for the first's batch to end, then sees its row (or not, if it rolled back).
Bodies should be database writes only: a slow body holds its batch's other jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from stream_jobs.errors import AlreadyDone

INSERT_DONE = (
    "INSERT INTO stream_jobs_done (job_id, job_type, attempt) VALUES ($1, $2, $3) "
    "ON CONFLICT (job_id) DO NOTHING"
)


_QUEUE_BEFORE_NEW_BATCH = 8
# How long a job's rollback to its savepoint, and a batch's COMMIT, may take before the
# connection is taken for dead (a Postgres that hangs: no answer, no error).
UNDO_TIMEOUT_S = 5.0
END_TIMEOUT_S = 30.0


class CommitBatch:
    """One open transaction that jobs join until it closes, then one COMMIT for all."""

    def __init__(self, conn: Any, release: Any, batch_max: int) -> None:
        self.conn = conn
        self._release = release
        self._batch_max = batch_max
        self._tx = conn.transaction()
        self.lock = asyncio.Lock()
        self.open = True
        self.joined = 0
        self.pending = 0
        self.job_ids: set[str] = set()
        self.poisoned: BaseException | None = None
        self.committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._savepoints = 0
        self._ending: asyncio.Task[None] | None = None
        self.undoing: asyncio.Task[None] | None = None  # a cancelled run's rollback

    async def begin(self) -> None:
        await self._tx.start()

    def join(self, job_id: str) -> None:
        self.joined += 1
        self.pending += 1
        self.job_ids.add(job_id)
        if self.joined >= self._batch_max:
            self.close()

    def next_savepoint(self) -> str:
        self._savepoints += 1
        return f"sj_{self._savepoints}"

    def leave(self) -> None:
        """A job is done with the connection (its savepoint released or rolled back)."""
        self.pending -= 1
        self._maybe_end()

    def close(self) -> None:
        """No more jobs join; the batch commits once the jobs in it are done."""
        self.open = False
        self._maybe_end()

    def _maybe_end(self) -> None:
        if not self.open and self.pending == 0 and self._ending is None:
            self._ending = asyncio.get_running_loop().create_task(self._end())

    async def _end(self) -> None:
        if self.undoing is not None:
            await self.undoing  # bounded, and never raises: a failure poisons the batch
        try:
            if self.poisoned is not None:
                raise self.poisoned  # rolled back by the connection's end, below
            # Bounded: on a Postgres that hangs the batch fails (and its jobs are retried,
            # the dedup rows absorbing a COMMIT that did land) rather than holding its
            # connection and its jobs' slots for as long as the link is dead.
            async with asyncio.timeout(END_TIMEOUT_S):
                await self._commit()
        except BaseException as exc:  # every waiting job must hear about it
            if not self.committed.done():
                self.committed.set_exception(exc)
            # A connection in an unknown state is not reused; ended without a goodbye,
            # which a connection that does not answer would never finish. Postgres rolls
            # back what it holds open when it sees the socket close.
            self.conn.terminate()
        else:
            self.committed.set_result(None)
        finally:
            await self._release(self.conn)


    async def _commit(self) -> None:
        # Postgres answers COMMIT of an aborted transaction (a body caught a failed
        # statement's error and went on) with a ROLLBACK that asyncpg does not report:
        # every job of the batch would be acknowledged and nothing written. This one
        # round trip per batch raises InFailedSQLTransactionError instead.
        await self.conn.execute("SELECT 1")
        await self._tx.commit()


class GroupCommitter:
    """Hands out places in open batches. Up to `parallel` batches fill at once, each on
    its own connection (jobs of one batch take turns on its connection), and earlier
    batches may still be committing meanwhile."""

    def __init__(self, pool: asyncpg.Pool, *, batch_max: int, linger_s: float,
                 parallel: int) -> None:
        self._pool = pool
        # Postgres keeps 64 subtransactions per transaction in shared memory; past that
        # every snapshot in the server slows down, so a batch stays below it.
        self._batch_max = min(batch_max, 60)
        self._linger_s = linger_s
        self._parallel = parallel
        self._open: list[CommitBatch] = []
        self._opening = asyncio.Lock()

    async def _batch_for(self, job_id: str) -> CommitBatch:
        while True:
            self._open = [b for b in self._open if b.open]
            same = next((b for b in self._open if job_id in b.job_ids), None)
            if same is not None:
                # The same job ID is already in a batch: wait for it to end, so this
                # run sees that run's row once it is committed (or rolled back).
                await asyncio.wait([same.committed])
                continue
            idle = min(self._open, key=lambda b: b.pending, default=None)
            # Another batch (connection) only when the queues on the open ones get long.
            if idle is not None and (idle.pending < _QUEUE_BEFORE_NEW_BATCH
                                     or len(self._open) >= self._parallel):
                idle.join(job_id)
                return idle
            if self._opening.locked():
                # Someone is opening a batch: wait for it, then look again.
                async with self._opening:
                    continue
            async with self._opening:
                conn = await self._pool.acquire()
                batch = CommitBatch(conn, self._pool.release, self._batch_max)
                try:
                    await batch.begin()
                except BaseException:
                    await self._pool.release(conn)
                    raise
                asyncio.get_running_loop().call_later(self._linger_s, batch.close)
                self._open.append(batch)
                batch.join(job_id)
                return batch

    @asynccontextmanager
    async def once(self, job_id: str, job_type: str, attempt: int) -> AsyncIterator[Any]:
        batch = await self._batch_for(job_id)
        left = False
        try:
            async with batch.lock:
                if batch.undoing is not None:
                    # A run before this one ended mid-statement: its rollback first.
                    await asyncio.shield(batch.undoing)
                conn = batch.conn
                savepoint = batch.next_savepoint()
                # One round trip: the savepoint and the claim go in one simple query.
                # (A savepoint needs no RELEASE; the batch's size keeps them few.)
                try:
                    status = await conn.execute(
                        f"SAVEPOINT {savepoint}; INSERT INTO stream_jobs_done (job_id, "
                        f"job_type, attempt) VALUES ({_literal(job_id)}, {_literal(job_type)}, "
                        f"{int(attempt)}) ON CONFLICT (job_id) DO NOTHING")
                except BaseException as exc:
                    # Cancelled (the handler's timeout) or failed mid-claim: the server may
                    # hold the claim, or an aborted transaction. Committed with the batch,
                    # a claim without its effects would mark the job done for good, and an
                    # aborted transaction would silently roll back the whole batch.
                    await _undo_after(exc, batch, savepoint)
                    raise
                if status.endswith(" 0"):
                    raise AlreadyDone(f"job {job_id} already finished")
                try:
                    yield conn
                except BaseException as exc:
                    await _undo_after(exc, batch, savepoint)
                    raise
            left = True
            batch.leave()
            # Finished only once durable: the whole batch's COMMIT.
            await asyncio.shield(batch.committed)
        finally:
            if not left:
                batch.leave()


async def _undo_after(exc: BaseException, batch: CommitBatch, savepoint: str) -> None:
    """Roll a run back to its savepoint: a run that failed waits for it; a cancelled one
    (its timeout, a cancel) ends now, and the rollback goes on beside it, the next run on
    the connection and the batch's COMMIT waiting for it. So a Postgres that stops
    answering mid-statement cannot hold a handler past its timeout."""
    if isinstance(exc, asyncio.CancelledError):
        batch.undoing = asyncio.get_running_loop().create_task(_undo(batch, savepoint))
    else:
        await _undo(batch, savepoint)


async def _undo(batch: CommitBatch, savepoint: str) -> None:
    """Roll one job back to its savepoint; if even that fails, the batch cannot commit."""
    try:
        # Bounded: after a handler's timeout cancelled a statement that Postgres never
        # answered, the rollback would wait as long; the batch is given up instead.
        # (asyncio.timeout, not wait_for: wait_for can swallow a cancellation that
        # arrives as the statement ends.)
        async with asyncio.timeout(UNDO_TIMEOUT_S):
            await asyncio.shield(batch.conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}"))
    except BaseException as exc:
        batch.poisoned = exc


def _literal(text: str) -> str:
    """`text` as an SQL string literal. Connections run with standard_conforming_strings
    on, where a quote doubled is the only escape; NUL cannot be in Postgres text at all."""
    if "\x00" in text:
        raise ValueError("a job ID or type cannot contain NUL")
    return "'" + text.replace("'", "''") + "'"
