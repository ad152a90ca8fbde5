"""The finish transaction: a job's dedup row, its effects, its result and its batch's
counters commit together, when the handler returns.

Only jobs that need it get one (`Finisher.finish_for`): a type declared with
`keep_result`, a batch member, a chain step. Every other job keeps the plain path, and
pays one attribute test for this. For those that do, the worker calls `before()` (a
chain step reads its parent's result), runs the handler, then `after()`, which writes
the finish statement (`stream_jobs.workflows.sql`) in the same transaction as the dedup
row, whichever form the handler used:

- `ctx.once()`: the block's transaction is held open (`stream_jobs.dedup.held`) past the
  block; the statement runs in it when the handler returns, then it commits. So the
  effects commit when the handler returns, not at the end of the block, and a handler
  that fails after its block leaves no effects;
- `ctx.once_deferred()`: the block's recorded statements are kept, not applied at its
  end; the finish statement joins them, and they go with the next deferred batch;
- neither: the worker claims the dedup row and writes the statement with the next
  deferred batch, so the job is `duplicate` if an earlier run finished.

A result that cannot be kept (not JSON, over `max_result_bytes`) fails the job before
anything commits. A job that ends without success (dead-lettered, expired, cancelled,
superseded) gets its terminal row through `record_ending`, retried until Postgres takes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from stream_jobs.dedup.deferred import DeferredWrites, Statement
from stream_jobs.dedup.held import Held
from stream_jobs.errors import (
    Abandoned,
    AlreadyDone,
    ConfigError,
    DatabaseUnavailable,
    FinishFailed,
    StreamJobsError,
)
from stream_jobs.failures import FailureInfo
from stream_jobs.outbox.rows import channel as outbox_channel
from stream_jobs.outcomes import Outcome
from stream_jobs.record import JobRecord
from stream_jobs.results.rules import StoredResult, encode_result
from stream_jobs.results.store import results_channel
from stream_jobs.settings import Settings
from stream_jobs.workflows.members import Membership, parse_membership
from stream_jobs.workflows.sql import Statements

log = logging.getLogger("stream_jobs.worker")

_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.2, 10.0


@runtime_checkable
class FinishStore(Protocol):
    """What a finish needs of the dedup store: `DedupStore` on Postgres has it, and so
    does the in-memory one of `stream_jobs.testing` (which reads the statements below)."""

    async def hold(self, job_id: str, job_type: str, attempt: int) -> Held: ...

    async def apply_deferred(self, job_id: str, job_type: str, attempt: int,
                             statements: list[Statement],
                             while_waiting: Callable[[], AbstractContextManager[None]] | None
                             = None) -> bool: ...

    async def execute(self, sql: str, *args: Any) -> None: ...

    async def result_of(self, job_id: str) -> StoredResult | None: ...


@dataclass(frozen=True)
class Finisher:
    """What one worker's type needs to finish its jobs (made once per worker)."""

    store: FinishStore | None  # None: a store without results (jobs finish the plain way)
    job_type: str
    keep_s: float | None  # the type's keep_result; None: it keeps no results
    max_result_bytes: int
    workflow_keep_s: float
    statements: Statements
    schema: str
    outbox_channel: str

    @classmethod
    def of(cls, store: FinishStore | None, settings: Settings, job_type: str,
           keep_s: float | None) -> Finisher:
        """`ConfigError` for a type with `keep_result` on a store that cannot keep it
        (`store` None: `Storage.finish_store` has none)."""
        if store is None and keep_s is not None:
            raise ConfigError(f"{job_type!r} keeps results (keep_result), which this "
                              "dedup store cannot keep: run it with the one on Postgres "
                              "(a worker's) or a JobTester's.")
        schema = settings.database_schema
        return cls(store, job_type, keep_s, settings.max_result_bytes,
                   settings.workflow_keep_s, Statements.of(schema), schema,
                   outbox_channel(schema))

    def finish_for(self, job: JobRecord) -> Finish | None:
        """The job's finish, or None when it needs none (the plain path)."""
        member = parse_membership(job.workflow) if job.workflow is not None else None
        if (member is None and self.keep_s is None) or self.store is None:
            return None
        return Finish(self, self.store, job, member)

    def ends_recorded(self, job: JobRecord) -> bool:
        """Whether a job that ends without success gets a row (kept results, members)."""
        return self.keep_s is not None or parse_membership(job.workflow) is not None

    def _keep_for(self, member: Membership | None) -> float:
        if member is None:
            assert self.keep_s is not None
            return self.keep_s
        return max(self.keep_s or 0.0, self.workflow_keep_s)

    def _channel_for(self, job_id: str, member: Membership | None) -> str | None:
        # Waiters exist for kept results and for chain steps (the next one reads it).
        kept = self.keep_s is not None or (member is not None and member.kind == "chain")
        return results_channel(self.schema, job_id) if kept else None

    def ending(self, job: JobRecord, state: str, reason: str) -> Statement | None:
        """The statement recording that `job` ended as `state` (None: nothing to record)."""
        member = parse_membership(job.workflow)
        if (member is None and self.keep_s is None) or self.store is None:
            return None
        args: tuple[Any, ...] = (job.job_id, job.job_type, job.attempt, reason,
                                 self._keep_for(member), self._channel_for(job.job_id, member),
                                 state)
        if member is None:
            return self.statements.terminal, args
        return (self.statements.member_ended,
                (*args, member.workflow_id, member.step, self.outbox_channel))


class Finish:
    """One job's finish transaction (see the module's docstring)."""

    __slots__ = ("_finisher", "_held", "_job", "_member", "_recorded", "_store", "parent_result")

    def __init__(self, finisher: Finisher, store: FinishStore, job: JobRecord,
                 member: Membership | None) -> None:
        self._finisher = finisher
        self._store = store
        self._job = job
        self._member = member
        self._held: Held | None = None
        self._recorded: list[Statement] | None = None
        self.parent_result: Any = None  # a chain step's previous step's result

    async def before(self) -> StreamJobsError | None:
        """Read what the handler may need (a chain step's parent result); the error that
        fails the run, if reading failed."""
        previous = self._member.previous_step_id if self._member is not None else None
        if previous is None:
            return None
        try:
            found = await self._store.result_of(previous)
        except StreamJobsError as exc:
            return exc
        self.parent_result = None if found is None else found.value()
        return None

    @asynccontextmanager
    async def once(self) -> AsyncIterator[Any]:
        """`ctx.once()` of this job: its held transaction (claimed on first entry)."""
        if self._held is None:
            job = self._job
            self._held = await self._store.hold(job.job_id, job.job_type, job.attempt)
        held = self._held
        try:
            yield held.conn
        except BaseException:
            self._held = None
            await held.rollback()  # the block failed: nothing of it commits
            raise

    async def abandon(self) -> None:
        """Roll back a held transaction: the run ends without an outcome of its own."""
        held, self._held = self._held, None
        if held is not None:
            await held.rollback()

    def deferred(self) -> _KeptBlock:
        """`ctx.once_deferred()` of this job: recorded, kept for `after()`."""
        return _KeptBlock(self)

    async def after(self, error: Exception | None, returned: object,
                    lend_slot: Callable[[], AbstractContextManager[None]] | None = None
                    ) -> Exception | None:
        """End the transaction: commit it with the result if the handler returned, roll it
        back if it failed. The run's error (the handler's, `AlreadyDone` for a duplicate,
        or why the finish failed), or None once committed."""
        held, self._held = self._held, None
        if error is None:
            try:
                statement = self._success(returned)
            except StreamJobsError as exc:  # a result that cannot be kept fails the run
                error = exc
        if error is not None:
            if held is not None:
                await held.rollback()
            return error
        try:
            if held is not None:
                try:
                    await held.execute(str(statement[0]), *statement[1])
                except BaseException:
                    await held.rollback()
                    raise
                await held.commit()
                return None
            job = self._job
            applied = await self._store.apply_deferred(
                job.job_id, job.job_type, job.attempt, [*(self._recorded or ()), statement],
                lend_slot)
        except StreamJobsError as exc:
            return exc
        if not applied:
            return AlreadyDone(f"job {self._job.job_id} already finished")
        return None

    def _success(self, returned: object) -> Statement:
        f, job, member = self._finisher, self._job, self._member
        keep_value = f.keep_s is not None or (member is not None and member.kind == "chain")
        result = (encode_result(returned, job_type=job.job_type, max_bytes=f.max_result_bytes)
                  if keep_value else None)
        args: tuple[Any, ...] = (job.job_id, job.job_type, job.attempt, result,
                                 f._keep_for(member), f._channel_for(job.job_id, member))
        if member is None:
            return f.statements.succeeded, args
        return (f.statements.member_succeeded,
                (*args, member.workflow_id, member.step, f.outbox_channel))


class _KeptBlock:
    """`async with ctx.once_deferred() as writes:` of a job with a finish: its statements
    are kept for the finish instead of applied at the block's end."""

    __slots__ = ("_finish", "writes")

    def __init__(self, finish: Finish) -> None:
        self._finish = finish
        self.writes = DeferredWrites()

    async def __aenter__(self) -> DeferredWrites:
        return self.writes

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.writes.closed = True
        if exc_type is None:
            kept = self._finish._recorded
            self._finish._recorded = [*(kept or ()), *self.writes.statements]


def ending_row(outcome: Outcome, failure: FailureInfo | None) -> tuple[str, str] | None:
    """What `record_ending` records for a job that ended `outcome`: its state and its
    reason (a kept result's `error`); `failure` is a dead letter's. None for an outcome
    that records nothing here (a success commits its row in its finish; a retry or a
    duplicate has none)."""
    if failure is not None:
        return "failed", f"{failure.reason}: {failure.error_class}: {failure.message}"
    if outcome is Outcome.SUPERSEDED:
        return str(outcome), "superseded by a newer job of its debounce key"
    if outcome is Outcome.CANCELLED:
        return str(outcome), "cancelled"
    if outcome is Outcome.EXPIRED:
        return str(outcome), "expired before it ran"
    return None


async def record_ending(finisher: Finisher, job: JobRecord, state: str, reason: str,
                        stopping: asyncio.Event) -> None:
    """Write the row of a job that ended without success (and its batch's counters),
    retrying with backoff until Postgres takes it; `Abandoned` once `stopping` is set
    (the job's offset stays unfinished, and its next owner ends it again)."""
    statement = finisher.ending(job, state, reason)
    if statement is None or finisher.store is None:
        return
    backoff_s = _BACKOFF_FIRST_S
    while True:
        try:
            await finisher.store.execute(statement[0], *statement[1])
            return
        except (DatabaseUnavailable, FinishFailed) as exc:
            log.warning("job %s (%s) ended %s, but its result row was not written; trying "
                        "again in %.1f s: %s", job.job_id, job.job_type, state, backoff_s, exc)
            with suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), backoff_s)
            if stopping.is_set():
                raise Abandoned("stopped before the job's result row was written") from exc
            backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)


__all__ = ["Finish", "Finisher", "ending_row", "record_ending"]
