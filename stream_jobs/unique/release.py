"""The worker's side of unique keys and debounce: give a key back when its job finished,
and tell whether a debounced job was superseded. Only jobs that carry the `sj-unique` or
`sj-debounce` header cost a query; other jobs never reach this module.

Releases are batched: one statement gives back every key whose job finished while the
previous statement ran (one at a time, so under load the batches grow), so jobs holding
keys cost a round trip per batch, not per job. A release is retried until Postgres takes
it (the job's offset stays unfinished meanwhile): a key given back late holds off the
next enqueue a little longer, a key never given back would hold it off for good. If the
worker dies before the release, the job is delivered again, finishes as a duplicate, and
the release happens then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from stream_jobs.errors import Abandoned, DatabaseUnavailable, StreamJobsError
from stream_jobs.postgres.pool import DRIVER_ERRORS, LazyPool, database_error
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.keys")

# Each key is deleted if its window has passed (nothing left to hold), else marked finished
# so the window alone holds it. Only the holder gives it back: after a redelivery the key
# may belong to a newer job. Arrays of (type, key, job ID), one entry per release.
RELEASE_UNIQUE = (
    "WITH r AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) "
    "AS r(job_type, unique_key, job_id)), "
    "gone AS (DELETE FROM stream_jobs_unique u USING r WHERE u.job_type = r.job_type "
    "AND u.unique_key = r.unique_key AND u.job_id = r.job_id "
    "AND (u.held_until IS NULL OR u.held_until <= statement_timestamp()) "
    "RETURNING u.job_type, u.unique_key) "
    "UPDATE stream_jobs_unique u SET finished_at = statement_timestamp() FROM r "
    "WHERE u.job_type = r.job_type AND u.unique_key = r.unique_key AND u.job_id = r.job_id "
    "AND u.finished_at IS NULL AND NOT EXISTS (SELECT 1 FROM gone g "
    "WHERE g.job_type = u.job_type AND g.unique_key = u.unique_key)")
_RELEASE_BATCH_MAX = 1000

Release = tuple[str, str, str]  # (job type, unique key, job ID)
SUPERSEDED_BY = "SELECT by_job_id FROM stream_jobs_superseded WHERE job_id = $1"
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.2, 10.0
T = TypeVar("T")


class Keys(Protocol):
    """What a worker does with unique keys and debounce markers: `KeyStore` on Postgres,
    or `stream_jobs.testing`'s in-memory one. The meanings are `KeyStore`'s."""

    async def release_until_done(self, job_type: str, unique_key: str, job_id: str,
                                 stopping: asyncio.Event) -> None: ...

    async def superseded_by(self, job_id: str) -> str | None: ...

    async def close(self) -> None: ...


class KeyStore:
    """Unique-key releases and supersession checks, on a small pool of their own."""

    def __init__(self, settings: Settings, *, pool: LazyPool | None = None) -> None:
        self.settings = settings
        self._pool = pool or LazyPool(settings, max_size=4, name="stream-jobs keys")
        self.released = 0
        self.statements = 0  # release statements run (fewer than releases under load)
        self._waiting: list[tuple[Release, asyncio.Future[None]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        await self._pool.close()

    async def release(self, job_type: str, unique_key: str, job_id: str) -> None:
        """Give the key back (once; raises our errors), with the releases that come meanwhile."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Read by shield's waiter, or here if that waiter was cancelled: never unretrieved.
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._waiting.append(((job_type, unique_key, job_id), done))
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._flush())
        await asyncio.shield(done)  # a cancelled job leaves the batch to finish

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[:_RELEASE_BATCH_MAX]
                del self._waiting[:_RELEASE_BATCH_MAX]
                try:
                    pool = await self._pool.get()
                    await pool.execute(RELEASE_UNIQUE, *(list(column) for column in
                                                         zip(*(r for r, _ in batch),
                                                             strict=True)))
                except DRIVER_ERRORS as exc:
                    error = database_error(exc, self._pool, "give back unique keys")
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(error)
                    continue
                except StreamJobsError as exc:
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                self.statements += 1
                self.released += len(batch)
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._flushing = None

    async def release_until_done(self, job_type: str, unique_key: str, job_id: str,
                                 stopping: asyncio.Event) -> None:
        """`release`, retried with backoff; `Abandoned` once `stopping` is set, leaving the
        job to its next delivery (which releases it then)."""
        await until_done(lambda: self.release(job_type, unique_key, job_id), stopping,
                         f"unique key {unique_key!r} of job {job_id} not given back yet")

    async def superseded_by(self, job_id: str) -> str | None:
        """The job that superseded debounced job `job_id`, or None (it is its window's last)."""
        try:
            pool = await self._pool.get()
            found = await pool.fetchval(SUPERSEDED_BY, job_id)
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, "read the debounce markers") from exc
        return None if found is None else str(found)


async def until_done(call: Callable[[], Awaitable[T]], stopping: asyncio.Event,
                     what: str) -> T:
    """`call()` retried with backoff (up to 10 s) while Postgres is unavailable; `Abandoned`
    once `stopping` is set. For the reads and writes a job's outcome waits on: its offset
    stays unfinished meanwhile, so a crash here delivers the job again. Any other error
    (a schema without the tables) is raised: waiting would not cure it."""
    backoff_s = _BACKOFF_FIRST_S
    while True:
        try:
            return await call()
        except DatabaseUnavailable as exc:
            log.warning("%s, trying again in %.1f s: %s", what, backoff_s, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), backoff_s)
        if stopping.is_set():
            raise Abandoned(f"stopped while waiting for Postgres: {what}")
        backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)


__all__ = ["RELEASE_UNIQUE", "SUPERSEDED_BY", "KeyStore", "Keys", "until_done"]
