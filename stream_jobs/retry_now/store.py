"""Retry now in Postgres: the row that says an attempt was released early, written in a
transaction that stays open while the copy is produced (`releasing`), and its prune.

The row is inserted first (a second retry-now of the same attempt finds it and is
refused), with the NOTIFY that tells every process's cancel watch; the caller produces
the copy inside the block; the commit makes both visible. If the produce fails the block
raises and the transaction rolls back: no row, no notice, and the job still waits in its
tier as before. Were the commit to fail after the copy was written, the copy and the
original would both run: the one case in which the attempt can run twice, told in the
error (`ctx.once()` keeps its effects single).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

from stream_jobs.cancels.rules import NoticeKind, ReleasedKey, channel, notice, released_text
from stream_jobs.errors import AlreadyReleased, DatabaseUnavailable
from stream_jobs.postgres.pool import DRIVER_ERRORS, LazyPool, database_error
from stream_jobs.settings import Settings

_INSERT = ("INSERT INTO stream_jobs_released_early (job_id, requeues, attempt, job_type) "
           "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING")
_PRUNE = "DELETE FROM stream_jobs_released_early WHERE released_at < $1"


class ReleaseStore:
    """Released-early rows through a small pool of their own, opened on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._pool = LazyPool(settings, max_size=1, name="stream-jobs retry-now")
        self._channel = channel(settings.database_schema)

    async def close(self) -> None:
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def releasing(self, job_type: str, key: ReleasedKey) -> AsyncIterator[None]:
        """The block in which the copy is produced: the row inserted and the NOTIFY sent
        before, committed after it; rolled back if it raises. `AlreadyReleased` when the
        attempt was released early before."""
        job_id, requeues, attempt = key
        try:
            pool = await self._pool.get()
            async with pool.acquire() as conn:
                transaction = conn.transaction()
                await transaction.start()
                try:
                    status = await conn.execute(_INSERT, job_id, requeues, attempt, job_type)
                    if status.endswith(" 0"):
                        raise AlreadyReleased(f"Attempt {attempt} of job {job_id} was "
                                              "already retried now; nothing changed.")
                    await conn.execute("SELECT pg_notify($1, $2)", self._channel, notice(
                        NoticeKind.RELEASED, job_type, released_text(key)))
                    yield
                except BaseException:
                    await transaction.rollback()  # no copy written: nothing happened
                    raise
                try:
                    await transaction.commit()
                except DRIVER_ERRORS as exc:
                    raise DatabaseUnavailable(
                        f"The copy of job {job_id} was written to its lane, but recording "
                        "the early release failed, so its tier record may run too (effects "
                        f"written through ctx.once() still happen once): {exc}") from exc
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "record the early release") from exc

    async def prune(self, cutoff: datetime) -> int:
        """Delete the rows of attempts released before `cutoff`; how many were deleted.
        (A row is needed only until its tier record's due time has passed.)"""
        try:
            pool = await self._pool.get()
            status = await pool.execute(_PRUNE, cutoff)
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "prune the early releases") from exc
        return int(status.rsplit(" ", 1)[-1])


__all__ = ["ReleaseStore"]
