"""Cancels in Postgres: the transaction that cancels a job, and what workers read back.

`cancel()` is one transaction (the rule is `stream_jobs.cancels.rules`'): insert the job's dedup
row with attempt 0 (`ON CONFLICT DO NOTHING`); if it was there, the job finished (or was
cancelled) before, and nothing is written; else add the `stream_jobs_cancels` row, give
back the unique key the job held, and NOTIFY the workers. The commit makes all of it
visible at once.

A run that claimed the dedup row and has not committed makes the insert wait for its
transaction. After `CLAIM_WAIT_S` the cancel rolls back, NOTIFYs an interrupt for the job
(the worker stops the run, whose transaction rolls back) and tries again, waiting up to
`INTERRUPT_WAIT_S`: it wins if the run rolled back, and answers "already finished" if
the run committed first. A run that does neither in time is `CancelPending`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import asyncpg

from stream_jobs.cancels.rules import (
    CLAIM_WAIT_S,
    INTERRUPT_WAIT_S,
    MARKER_ATTEMPT,
    CancelAnswer,
    Cancellation,
    NoticeKind,
    ReleasedKey,
    channel,
    checked_reason,
    notice,
)
from stream_jobs.errors import CancelPending
from stream_jobs.postgres.pool import DRIVER_ERRORS, MISSING_TABLE, LazyPool, database_error
from stream_jobs.settings import Settings

_CLAIM = ("INSERT INTO stream_jobs_done (job_id, job_type, attempt) VALUES ($1, $2, $3) "
          "ON CONFLICT (job_id) DO NOTHING")
_RECORD = "INSERT INTO stream_jobs_cancels (job_id, job_type, reason) VALUES ($1, $2, $3)"
# The cancelled job's unique key is free for the next enqueue once its window passed.
_RELEASE_KEY = ("UPDATE stream_jobs_unique SET finished_at = statement_timestamp() "
                "WHERE job_id = $1 AND finished_at IS NULL")
_EARLIER = ("SELECT c.job_type AS cancelled_type, c.reason, d.job_type, d.attempt, "
            "d.finished_at FROM stream_jobs_done d LEFT JOIN stream_jobs_cancels c "
            "ON c.job_id = d.job_id WHERE d.job_id = $1")


class CancelStore:
    """Cancels through a small pool of their own, opened on first use."""

    def __init__(self, settings: Settings, *, pool: LazyPool | None = None) -> None:
        self.settings = settings
        self._pool = pool or LazyPool(settings, max_size=2, name="stream-jobs cancels")
        self._channel = channel(settings.database_schema)

    async def close(self) -> None:
        await self._pool.close()

    async def cancel(self, job_id: str, *, job_type: str | None = None,
                     reason: str | None = None) -> Cancellation:
        """Cancel `job_id` unless it finished: see the module's docstring."""
        stored_reason = checked_reason(reason)
        own_type = job_type or ""
        try:
            pool = await self._pool.get()
            async with pool.acquire() as conn:
                try:
                    answer = await self._try(conn, job_id, own_type, stored_reason, CLAIM_WAIT_S)
                except asyncpg.LockNotAvailableError:
                    # A run holds the claim in an open ctx.once(): have it stopped, then
                    # wait for its transaction to end.
                    await conn.execute("SELECT pg_notify($1, $2)", self._channel,
                                       notice(NoticeKind.INTERRUPT, own_type, job_id))
                    try:
                        answer = await self._try(conn, job_id, own_type, stored_reason,
                                                 INTERRUPT_WAIT_S)
                    except asyncpg.LockNotAvailableError as exc:
                        raise CancelPending(
                            f"Job {job_id} is in a ctx.once() transaction that did not end "
                            f"within {INTERRUPT_WAIT_S:g} s of being asked to stop; cancel "
                            "again later to learn whether it committed.") from exc
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "cancel the job") from exc
        if answer is not None:
            return answer
        return Cancellation(job_id, CancelAnswer.CANCELLED, job_type, stored_reason)

    async def _try(self, conn: Any, job_id: str, job_type: str, reason: str | None,
                   wait_s: float) -> Cancellation | None:
        """One cancel transaction: None when it won, else the earlier outcome. Waits at
        most `wait_s` for another transaction's claim (LockNotAvailableError)."""
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = '{int(wait_s * 1000)}ms'")
            status = await conn.execute(_CLAIM, job_id, job_type, MARKER_ATTEMPT)
            if status.endswith(" 0"):
                return _earlier(job_id, await conn.fetchrow(_EARLIER, job_id))
            await conn.execute(_RECORD, job_id, job_type, reason)
            await conn.execute(_RELEASE_KEY, job_id)
            await conn.execute("SELECT pg_notify($1, $2)", self._channel,
                               notice(NoticeKind.CANCEL, job_type, job_id))
        return None

    async def cancelled_ids(self, job_type: str) -> set[str]:
        """The IDs cancelled for `job_type`, or without a type."""
        try:
            pool = await self._pool.get()
            rows = await pool.fetch("SELECT job_id FROM stream_jobs_cancels "
                                    "WHERE job_type = $1 OR job_type = ''", job_type)
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "read the cancelled jobs") from exc
        return {row["job_id"] for row in rows}

    async def released_early(self, job_type: str) -> set[ReleasedKey]:
        """The attempts of `job_type` that `stream-jobs retry-now` released from their
        delay tier (stream_jobs/retry_now/): (job ID, requeues, attempt)."""
        try:
            pool = await self._pool.get()
            rows = await pool.fetch("SELECT job_id, requeues, attempt FROM "
                                    "stream_jobs_released_early WHERE job_type = $1", job_type)
        except MISSING_TABLE:
            return set()  # migrated before retry-now existed: nothing was released early
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "read the jobs released early") from exc
        return {(row["job_id"], row["requeues"], row["attempt"]) for row in rows}

    async def is_cancelled(self, job_id: str) -> bool:
        try:
            pool = await self._pool.get()
            found = await pool.fetchval("SELECT 1 FROM stream_jobs_cancels WHERE job_id = $1",
                                        job_id)
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "read the cancelled jobs") from exc
        return found is not None

    async def cancelled(self, job_id: str) -> tuple[str, str | None, datetime] | None:
        """(job type, reason, when) of a cancelled job, or None."""
        try:
            pool = await self._pool.get()
            row = await pool.fetchrow("SELECT job_type, reason, cancelled_at FROM "
                                      "stream_jobs_cancels WHERE job_id = $1", job_id)
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "read the cancelled jobs") from exc
        return None if row is None else (row["job_type"], row["reason"], row["cancelled_at"])

    async def prune(self, cutoff: datetime) -> int:
        """Delete cancels and superseded markers from before `cutoff` (the dedup prune's
        cutoff: the markers' dedup rows go with it); how many rows were deleted."""
        try:
            pool = await self._pool.get()
            async with pool.acquire() as conn, conn.transaction():
                counts = [await conn.execute(sql, cutoff) for sql in _PRUNE]
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "prune cancels and unique keys") from exc
        return sum(int(status.rsplit(" ", 1)[-1]) for status in counts)


# What `db prune` removes beside the dedup rows: cancels and superseded markers older than
# the cutoff, unique keys given back before it, debounce windows that ended before it.
_PRUNE: Iterable[str] = (
    "DELETE FROM stream_jobs_cancels WHERE cancelled_at < $1",
    "DELETE FROM stream_jobs_superseded WHERE superseded_at < $1",
    "DELETE FROM stream_jobs_unique WHERE finished_at < $1 "
    "AND (held_until IS NULL OR held_until < $1)",
    "DELETE FROM stream_jobs_debounce WHERE window_ends_at < $1",
)


def _earlier(job_id: str, row: Any) -> Cancellation:
    """The answer when the job's dedup row existed: an earlier cancel, or a run."""
    if row is None:  # the row went between the insert and the read: only a prune does that
        return Cancellation(job_id, CancelAnswer.ALREADY_FINISHED,
                            detail="Its dedup row was pruned meanwhile.")
    if row["cancelled_type"] is not None:
        reason = row["reason"]
        detail = f"Reason given then: {reason}." if reason else ""
        return Cancellation(job_id, CancelAnswer.ALREADY_CANCELLED,
                            row["cancelled_type"] or None, reason, detail)
    when = row["finished_at"]
    return Cancellation(job_id, CancelAnswer.ALREADY_FINISHED, row["job_type"] or None,
                        detail=f"Attempt {row['attempt']} committed its effects at "
                               f"{when.isoformat(timespec='seconds')}.")


__all__ = ["CancelStore"]
