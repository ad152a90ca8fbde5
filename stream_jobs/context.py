"""What a handler gets besides its payload: the job's identity and `once()`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stream_jobs.dedup import DedupStore
from stream_jobs.deferred import DeferredWrites


@dataclass(frozen=True, slots=True)
class JobContext:
    """The running job. `job_id` is the idempotency key for effects outside Postgres."""

    job_id: str
    job_type: str
    attempt: int
    key: str | None
    enqueued_at_ms: int
    lane: str
    topic: str
    partition: int
    offset: int
    _dedup: DedupStore
    # Given by the worker: wraps a wait for a group commit so the job lends its slot.
    _lend_slot: Callable[[], AbstractContextManager[None]] | None = None

    @property
    def enqueued_at(self) -> datetime:
        """When the job was first enqueued (UTC)."""
        return ms_to_datetime(self.enqueued_at_ms)

    @asynccontextmanager
    async def once(self) -> AsyncIterator[Any]:
        """An asyncpg connection inside an open transaction that holds this job's dedup row.

        Write the job's effects through it: they commit together with the row, so they
        happen once per job ID. If an earlier run already committed, the body does not run
        and the job is acknowledged as a duplicate.
        """
        async with self._dedup.once(self.job_id, self.job_type, self.attempt) as conn:
            yield conn

    def once_deferred(self) -> AbstractAsyncContextManager[DeferredWrites]:
        """Like `once()` for bodies that only write: `await writes.execute(sql, *args)`
        records a statement, and many jobs' statements and dedup rows are applied together
        in one transaction (much faster). The block returns once they committed. If an
        earlier run already committed, nothing recorded is applied and the job is
        acknowledged as a duplicate. The body cannot read through `writes`.
        While the job waits for its batch to commit it does not count against the type's
        `concurrency`: another job starts meanwhile, so the next batch fills.
        """
        return self._dedup.once_deferred(self.job_id, self.job_type, self.attempt,
                                         while_waiting=self._lend_slot)


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
