"""Group commit for `ctx.once()`: many jobs' dedup rows and effects in one transaction.

Committing a transaction costs a WAL flush, so one transaction per job caps a worker at a
few hundred jobs a second. A `CommitBatch` is one open transaction on one connection
that jobs join for a short linger (or until it holds `batch_max` jobs); jobs take turns
on its connection (a lock), and `once()` returns only after the whole batch COMMITs, so a
job is marked finished only once its row and effects are durable. If the commit fails,
every job of the batch gets the error and goes through its retry tiers: nothing was
written for any of them.

Round trips are what a job costs here (measured: CPU per job follows them, in the
worker and in Postgres), so a batch spends as few as it can:

- the claims (dedup rows) of every job waiting for the connection go in one statement,
  made by whichever of them gets the connection first; a job whose row exists (an
  earlier run committed) is acknowledged as a duplicate without running;
- a batch is *optimistic* by default: bodies run with no savepoint, one round trip per
  statement they send and nothing else. If a body fails, the whole transaction is rolled
  back: the failed job goes through its retry tiers, the jobs that waited for the
  connection move to another batch, and the jobs whose bodies had already run hear
  `RolledBackWithOthers`, on which the worker runs them again at once (not as a new
  attempt, `stream_jobs.runtime.worker`) in a *careful* batch;
- a careful batch gives each body its own SAVEPOINT, so a failing body is rolled back
  alone (its claim deleted before the COMMIT). Reruns, retries (attempt > 1) and, for a
  second after a rollback, every job use careful batches: a type whose jobs fail often
  pays a savepoint per job rather than a rerun per failure.

The guarantee is the same as one transaction per job: the row and the effects commit
together or not at all, and every job's effects commit once. Two jobs with the same ID
never share a batch: the second waits for the first's batch to end, then sees its row
(or not, if it rolled back). Bodies should be database writes only: a slow body holds
its batch's other jobs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from stream_jobs.errors import AlreadyDone, RolledBackWithOthers

INSERT_DONE = (
    "INSERT INTO stream_jobs_done (job_id, job_type, attempt) VALUES ($1, $2, $3) "
    "ON CONFLICT (job_id) DO NOTHING"
)
# The claims of every job waiting for a batch's connection, in one round trip.
CLAIM_GROUP = (
    "INSERT INTO stream_jobs_done (job_id, job_type, attempt) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::int[]) "
    "ON CONFLICT (job_id) DO NOTHING RETURNING job_id"
)
# Claims of jobs that did not commit their effects (a careful body that failed, a job
# that left before its turn), deleted just before the batch's COMMIT.
RELEASE_CLAIMS = "DELETE FROM stream_jobs_done WHERE job_id = ANY($1::text[])"

# Another batch (connection) opens only once this many jobs queue on the open ones: a
# batch is cheapest big (one claim, one COMMIT), and with fast bodies one connection keeps
# up (measured: 48 ahead of 8, 16 and 32 on the bench of ops/bench).
_QUEUE_BEFORE_NEW_BATCH = 48
# How long a job's rollback to its savepoint, and a batch's COMMIT, may take before the
# connection is taken for dead (a Postgres that hangs: no answer, no error).
UNDO_TIMEOUT_S = 5.0
END_TIMEOUT_S = 30.0
# After an optimistic batch is rolled back, new batches are careful for this long.
CAREFUL_AFTER_ROLLBACK_S = 1.0


class Claim:
    """One job's place in a batch: its dedup row's values and whether the row was made
    (None: not yet claimed; True: claimed in the batch's transaction; False: it existed)."""

    __slots__ = ("attempt", "claimed", "job_id", "job_type")

    def __init__(self, job_id: str, job_type: str, attempt: int) -> None:
        self.job_id = job_id
        self.job_type = job_type
        self.attempt = attempt
        self.claimed: bool | None = None


class CommitBatch:
    """One open transaction that jobs join until it closes, then one COMMIT for all."""

    def __init__(self, conn: Any, release: Any, batch_max: int, *, careful: bool) -> None:
        self.conn = conn
        self._release = release
        self._batch_max = batch_max
        self.careful = careful
        self._tx = conn.transaction()
        self.lock = asyncio.Lock()
        self.open = True
        self.joined = 0
        self.pending = 0
        self.job_ids: set[str] = set()
        self.unclaimed: list[Claim] = []
        self.released: list[str] = []  # claims to delete before the COMMIT
        self.poisoned: BaseException | None = None
        # An optimistic batch given up (a body failed): jobs that have not run move to
        # another batch, jobs that ran hear it (RolledBackWithOthers) at the commit.
        self.rolled_back: RolledBackWithOthers | None = None
        self.committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A rolled-back batch whose jobs all left before the end has no one to hear it.
        self.committed.add_done_callback(_heard)
        self._savepoints = 0
        self._ending: asyncio.Task[None] | None = None
        self.undoing: asyncio.Task[None] | None = None  # a cancelled run's rollback

    async def begin(self) -> None:
        await self._tx.start()

    def join(self, claim: Claim) -> None:
        self.joined += 1
        self.pending += 1
        self.job_ids.add(claim.job_id)
        self.unclaimed.append(claim)
        if self.joined >= self._batch_max:
            self.close()

    async def claim_waiting(self) -> None:
        """Claim every job of the batch not claimed yet, in one statement. A claim cut
        short (the claimer's timeout while a row lock holds it, a failed statement) leaves
        the server's state unknown: a careful batch claims behind a savepoint and rolls
        back to it (the next job's turn claims again); an optimistic one is given up by
        the caller, as for a failed body."""
        claims, self.unclaimed = self.unclaimed, []
        savepoint = self.next_savepoint() if self.careful else None
        try:
            if savepoint is not None:
                await self.conn.execute(f"SAVEPOINT {savepoint}")
            rows = await self.conn.fetch(
                CLAIM_GROUP, [c.job_id for c in claims], [c.job_type for c in claims],
                [c.attempt for c in claims])
        except BaseException as exc:
            self.unclaimed[:0] = claims
            if savepoint is not None:
                await _undo_after(exc, self, savepoint)
            raise
        made = {row[0] for row in rows}
        for claim in claims:
            claim.claimed = claim.job_id in made

    def next_savepoint(self) -> str:
        self._savepoints += 1
        return f"sj_{self._savepoints}"

    def leave(self, claim: Claim, *, ran: bool) -> None:
        """A job is done with the connection: its body ran (and its savepoint, if any, was
        released or rolled back), or it leaves without running (a duplicate, a
        cancellation, a rolled-back batch)."""
        if not ran:
            if claim.claimed is None and claim in self.unclaimed:
                self.unclaimed.remove(claim)
            elif claim.claimed:
                self.released.append(claim.job_id)
        self.pending -= 1
        self._maybe_end()

    def roll_back(self, why: BaseException) -> None:
        """Give the batch up: nothing of it commits, and no job joins it any more."""
        if self.rolled_back is None:
            self.rolled_back = RolledBackWithOthers(
                "another job's ctx.once() body failed in the transaction this job's "
                f"shared ({type(why).__name__}); nothing of this job was written")
        self.close()

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
            if self.rolled_back is not None:
                raise self.rolled_back
            # Bounded: on a Postgres that hangs the batch fails (and its jobs are retried,
            # the dedup rows absorbing a COMMIT that did land) rather than holding its
            # connection and its jobs' slots for as long as the link is dead.
            async with asyncio.timeout(END_TIMEOUT_S):
                await self._commit()
        except BaseException as exc:  # every waiting job must hear about it
            if not self.committed.done():
                if not self.careful and isinstance(exc, asyncpg.InFailedSQLTransactionError):
                    # A body caught a failed statement's error and went on: which one is
                    # not known, so every job of the batch runs again, carefully.
                    self.roll_back(exc)
                    exc = self.rolled_back or exc
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
        # round trip per batch (the claims to release, or a SELECT 1) raises
        # InFailedSQLTransactionError instead.
        if self.released:
            await self.conn.execute(RELEASE_CLAIMS, self.released)
        else:
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
        self._careful_until = 0.0
        self.rolled_back = 0  # optimistic batches given up, for tests and the bench

    async def _batch_for(self, claim: Claim, careful: bool) -> CommitBatch:
        while True:
            self._open = [b for b in self._open if b.open]
            same = next((b for b in self._open if claim.job_id in b.job_ids), None)
            if same is not None:
                # The same job ID is already in a batch: wait for it to end, so this
                # run sees that run's row once it is committed (or rolled back).
                await asyncio.wait([same.committed])
                continue
            idle = min((b for b in self._open if b.careful == careful),
                       key=lambda b: b.pending, default=None)
            # Another batch (connection) only when the queues on the open ones get long.
            if idle is not None and (idle.pending < _QUEUE_BEFORE_NEW_BATCH
                                     or len(self._open) >= self._parallel):
                idle.join(claim)
                return idle
            if self._opening.locked():
                # Someone is opening a batch: wait for it, then look again.
                async with self._opening:
                    continue
            async with self._opening:
                conn = await self._pool.acquire()
                batch = CommitBatch(conn, self._pool.release, self._batch_max,
                                    careful=careful)
                try:
                    await batch.begin()
                except BaseException:
                    await self._pool.release(conn)
                    raise
                asyncio.get_running_loop().call_later(self._linger_s, batch.close)
                self._open.append(batch)
                batch.join(claim)
                return batch

    @asynccontextmanager
    async def once(self, job_id: str, job_type: str, attempt: int, *,
                   careful: bool = False) -> AsyncIterator[Any]:
        """The batch's connection for the job's body, its dedup row claimed; returns once
        the batch committed. (The job keeps its slot meanwhile: lending it, as the
        deferred form does, stalled a fair type's workers across a rebalance,
        tests/integration/test_fairness.py.)"""
        if "\x00" in job_id or "\x00" in job_type:
            # Postgres text cannot hold NUL: the group's claim would fail for every job
            # in it. (The decoder dead-letters such records before they get here.)
            raise ValueError("a job ID or type cannot contain NUL")
        careful = careful or attempt > 1 or time.monotonic() < self._careful_until
        claim = Claim(job_id, job_type, attempt)
        while True:
            batch = await self._batch_for(claim, careful)
            ran = False  # the body had its turn on the connection
            try:
                async with batch.lock:
                    if batch.undoing is not None:
                        # A run before this one ended mid-statement: its rollback first.
                        await asyncio.shield(batch.undoing)
                    if batch.rolled_back is not None:
                        claim.claimed = None
                        continue  # rolled back before this job's turn: another batch
                    if claim.claimed is None:
                        try:
                            await batch.claim_waiting()
                        except BaseException as exc:
                            if not batch.careful:
                                self._roll_back(batch, exc)
                            raise
                    if not claim.claimed:
                        raise AlreadyDone(f"job {job_id} already finished")
                    ran = True
                    savepoint = batch.next_savepoint() if batch.careful else None
                    try:
                        if savepoint is not None:
                            await batch.conn.execute(f"SAVEPOINT {savepoint}")
                        yield batch.conn
                    except BaseException as exc:
                        if savepoint is None:
                            self._roll_back(batch, exc)
                            if isinstance(exc, asyncpg.InFailedSQLTransactionError):
                                # Not this body's failure: an earlier body swallowed one.
                                raise RolledBackWithOthers(str(batch.rolled_back)) from exc
                            raise
                        batch.released.append(job_id)  # its claim came before its savepoint
                        await _undo_after(exc, batch, savepoint)
                        raise
            finally:
                batch.leave(claim, ran=ran)
            # Finished only once durable: the whole batch's COMMIT.
            await asyncio.shield(batch.committed)
            return

    def _roll_back(self, batch: CommitBatch, why: BaseException) -> None:
        batch.roll_back(why)
        self.rolled_back += 1
        self._careful_until = time.monotonic() + CAREFUL_AFTER_ROLLBACK_S


def _heard(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


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
