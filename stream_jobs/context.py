"""What a handler gets besides its payload: the job's identity, `once()` and, for sync
handlers, `once_sync(session)`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from stream_jobs.dedup.deferred import DeferredWrites
from stream_jobs.dedup.store import DedupStore
from stream_jobs.dedup.sync_once import once_in
from stream_jobs.record import JobRecord

S = TypeVar("S")


class JobContext:
    """The running job. `job_id` is the idempotency key for effects outside Postgres.

    Read-only. Made for every job, so it keeps the decoded job and reads its fields from it
    on demand instead of copying a dozen of them per job.
    """

    __slots__ = ("_dedup", "_job", "_lend_slot", "_offset", "_partition", "_topic")

    def __init__(self, job: JobRecord, *, topic: str, partition: int, offset: int,
                 dedup: DedupStore,
                 lend_slot: Callable[[], AbstractContextManager[None]] | None = None) -> None:
        self._job = job
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._dedup = dedup
        # Given by the worker: wraps a wait for a group commit so the job lends its slot.
        self._lend_slot = lend_slot

    @property
    def job_id(self) -> str:
        return self._job.job_id

    @property
    def job_type(self) -> str:
        return self._job.job_type

    @property
    def attempt(self) -> int:
        """1 on the first run, 2 on the first retry, and so on."""
        return self._job.attempt

    @property
    def key(self) -> str | None:
        """The partition key as text (undecodable bytes replaced), or None."""
        key = self._job.key
        return key.decode(errors="replace") if key is not None else None

    @property
    def topic(self) -> str:
        """Where the job was read from: topic, partition and offset."""
        return self._topic

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def enqueued_at_ms(self) -> int:
        return self._job.enqueued_at_ms

    @property
    def lane(self) -> str:
        return self._job.lane

    def __repr__(self) -> str:
        return (f"JobContext(job_id={self.job_id!r}, job_type={self.job_type!r}, "
                f"attempt={self.attempt}, topic={self.topic!r}, partition={self.partition}, "
                f"offset={self.offset})")

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

    def once_sync(self, session: S) -> AbstractContextManager[S]:
        """For a plain `def` handler: `with ctx.once_sync(session):` makes `session` (a
        SQLAlchemy Session or Connection, or a DB-API connection, on the database that
        holds the dedup table) carry this job's dedup row, and the block its transaction.

        Write the job's effects through `session` inside the block: a clean exit commits
        them together with the row, so they happen once per job ID; an exception rolls
        both back. If an earlier run already committed, the body does not run and the job
        is acknowledged as a duplicate. A transaction already open on `session` is
        joined and committed with the block.
        """
        return once_in(session, job_id=self.job_id, job_type=self.job_type,
                       attempt=self.attempt, table=self._dedup.table)


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
