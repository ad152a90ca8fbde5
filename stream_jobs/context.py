"""What a handler gets besides its payload: the job's identity, `once()` (and, for sync
handlers, `once_sync(session)`), `enqueue()`, `batch()` / `chain()`, its fencing token
(`fencing_token_sync()` in a sync handler), a chain step's `parent_result`, and whether it
was cancelled."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from stream_jobs.client import Job, Seconds
from stream_jobs.dedup.deferred import DeferredWrites
from stream_jobs.dedup.fencing import FencingToken
from stream_jobs.dedup.store import Dedup
from stream_jobs.errors import ConfigError, NotInTransaction, RolledBackWithOthers, RunGivenUp
from stream_jobs.outbox.rows import child_job_id, insert_args, insert_sql
from stream_jobs.outbox.writer import write_async
from stream_jobs.record import JobRecord
from stream_jobs.results.finish import Finish
from stream_jobs.workflows.create import Plan, batch_plan, chain_plan, record_plan, write_plan
from stream_jobs.workflows.members import workflow_id_for

S = TypeVar("S")

if TYPE_CHECKING:
    from pydantic import BaseModel

    from stream_jobs.client import JobClient


class SyncCall(Protocol):
    """A plain `def` handler's call on a thread of its worker's pool, as its context sees
    it (`stream_jobs.runtime.threads.ThreadCall`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The worker's event loop, which the call's thread is not."""
        ...

    def waited(self) -> bool:
        """On the loop: whether the job still waits for the call (it has not returned, nor
        run past its timeout, nor been abandoned to the partition's next owner)."""
        ...


class JobContext:
    """The running job. `job_id` is the idempotency key for effects outside Postgres.

    Read-only. Made for every job, so it keeps the decoded job and reads its fields from it
    on demand instead of copying a dozen of them per job.
    """

    # `_fencing` is left unset until `fencing_token` is first read: a handler that never
    # reads it pays nothing for it, not even a store here. `_sync_call` is set only for a
    # plain `def` handler, by the thread pool that runs it.
    __slots__ = ("_cancelled", "_careful", "_children", "_conn", "_dedup", "_enqueued",
                 "_fencing", "_finish", "_job", "_lend_slot", "_offset", "_partition",
                 "_rolled_back", "_sync_call", "_topic", "_writes")

    _fencing: FencingToken
    _sync_call: SyncCall

    def __init__(self, job: JobRecord, *, topic: str, partition: int, offset: int,
                 dedup: Dedup,
                 lend_slot: Callable[[], AbstractContextManager[None]] | None = None,
                 children: JobClient | None = None, finish: Finish | None = None,
                 careful: bool = False) -> None:
        self._job = job
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._dedup = dedup
        # Given by the worker: wraps a wait for a group commit so the job lends its slot.
        self._lend_slot = lend_slot
        # Child jobs: checked and made by `children`, written through the open block.
        self._children = children
        self._conn: Any = None
        self._writes: DeferredWrites | None = None
        self._enqueued = 0
        # The job's finish transaction (keep_result, batch member, chain step), else None.
        self._finish = finish
        # Set through `stop_for_cancel` when a cancel for this job arrives while it runs.
        self._cancelled = False
        # A run again after its group commit was rolled back with another job's failure:
        # its ctx.once() block goes in its own savepoint (stream_jobs.dedup.group_commit).
        self._careful = careful
        self._rolled_back = False

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

    @property
    def tenant(self) -> str | None:
        """The customer the job is for, as it was enqueued (`enqueue(..., tenant=...)`), or
        None for a job of no tenant."""
        return self._job.tenant

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled while this run goes on (`client.cancel`). An
        async handler also gets `CancelledError` at its next await; a sync one (which
        cannot be interrupted) should look at this between steps and return. Either way
        the job finishes as `cancelled`, and a `ctx.once()` block it has not committed
        yet cannot commit any more."""
        return self._cancelled

    # -- the runtime's side of a cancel (`stream_jobs.runtime.admission`) --------------------

    def stop_for_cancel(self) -> bool:
        """For the worker: a cancel reached this run, so `cancelled` turns True. False if
        it already had (a run is stopped once)."""
        if self._cancelled:
            return False
        self._cancelled = True
        return True

    @property
    def in_once(self) -> bool:
        """For the worker: whether the handler is inside its `ctx.once()` block now,
        holding the job's dedup row (a cancel that waits for that row stops such a run)."""
        return self._conn is not None

    @property
    def fencing_token(self) -> Awaitable[int]:
        """`token = await ctx.fencing_token`: a number above every token handed out before
        it was asked for, so above the tokens of this job's earlier deliveries (a retry, a
        requeue, a replay, a redelivery after a rebalance or a restart). For a store
        outside Postgres that accepts a write only with a token not below the one it
        holds, so a superseded run's late write is refused (docs/fencing.md).

        Taken from the dedup database on the first await (one round trip, shared with
        other jobs asking at the same moment), then the same for the rest of this run; no
        other run gets it. Await it first, before reading what the write is computed from.
        In a plain `def` handler, `ctx.fencing_token_sync()` gives the same token.
        """
        return self._token()

    def _token(self) -> FencingToken:
        try:
            return self._fencing
        except AttributeError:
            self._fencing = FencingToken(self._dedup.fencing_token)
            return self._fencing

    def fencing_token_sync(self) -> int:
        """`token = ctx.fencing_token_sync()` in a plain `def` handler: the token `await
        ctx.fencing_token` gives an async one, taken the same way (on the worker's event
        loop, one round trip shared with other jobs) and the same number on every later
        call or await in this run. The handler's thread waits for it; the loop does not.

        Call it first, before reading what the write is computed from. A thread that runs
        on after its job stopped waiting for it (past its timeout, or abandoned to the
        partition's next owner) gets no new token: `RunGivenUp`, since the job's next run
        may already hold a token and this run's write must not win over it. A token taken
        before then is still given. `DatabaseUnavailable` if Postgres does not answer.
        """
        call = self._thread_call()

        async def on_loop() -> int:
            token = self._token()
            if not token.asked and not call.waited():
                raise RunGivenUp(
                    f"Job {self.job_id} ({self.job_type}) attempt {self.attempt} is no longer "
                    "waited for (its timeout passed, or its partition went to another "
                    "worker), so this run gets no fencing token: its job's next run may "
                    "hold a later one. Take the token first in the handler.")
            return await token

        return asyncio.run_coroutine_threadsafe(on_loop(), call.loop).result()

    def _thread_call(self) -> SyncCall:
        """The call of a plain `def` handler that this context belongs to; `ConfigError`
        for any other (or for a call from its worker's loop, which would never answer)."""
        call: SyncCall | None = getattr(self, "_sync_call", None)
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if call is None or loop is call.loop:
            raise ConfigError(
                "ctx.fencing_token_sync() waits on its thread for the token, so it is for a "
                "plain `def` handler, which the worker runs on a thread; in an `async def`, "
                "`token = await ctx.fencing_token` (and hand the number to a thread of "
                "yours).")
        return call

    def __repr__(self) -> str:
        return (f"JobContext(job_id={self.job_id!r}, job_type={self.job_type!r}, "
                f"attempt={self.attempt}, topic={self.topic!r}, partition={self.partition}, "
                f"offset={self.offset})")

    @property
    def enqueued_at(self) -> datetime:
        """When the job was first enqueued (UTC)."""
        return ms_to_datetime(self.enqueued_at_ms)

    @property
    def parent_result(self) -> Any:
        """In a chain's step: the result the step before it returned (None in a first
        step, or outside a chain)."""
        return self._finish.parent_result if self._finish is not None else None

    @asynccontextmanager
    async def once(self) -> AsyncIterator[Any]:
        """An asyncpg connection inside an open transaction that holds this job's dedup row.

        Write the job's effects through it: they commit together with the row, so they
        happen once per job ID. If an earlier run already committed, the body does not run
        and the job is acknowledged as a duplicate. For a type with `keep_result`, a
        batch member or a chain step, the transaction stays open until the handler
        returns and commits with its result (docs/results.md).
        """
        if self._finish is not None:
            async with self._finish.once() as conn:
                self._conn = conn
                try:
                    yield conn
                finally:
                    self._conn = None
            return
        try:
            async with self._dedup.once(self.job_id, self.job_type, self.attempt,
                                        careful=self._careful) as conn:
                self._conn = conn
                try:
                    yield conn
                finally:
                    self._conn = None
        except RolledBackWithOthers:
            # Noted here, so the worker runs the job again even if the handler catches it.
            self._rolled_back = True
            raise

    @property
    def rolled_back_with_others(self) -> bool:
        """True when this run's `once()` block was rolled back by another job's failure
        in the transaction they shared: nothing of it was written, and the worker runs
        the job again at once (not as a new attempt)."""
        return self._rolled_back

    def once_deferred(self) -> AbstractAsyncContextManager[DeferredWrites]:
        """Like `once()` for bodies that only write: `await writes.execute(sql, *args)`
        records a statement, and many jobs' statements and dedup rows are applied together
        in one transaction (much faster). The block returns once they committed. If an
        earlier run already committed, nothing recorded is applied and the job is
        acknowledged as a duplicate. The body cannot read through `writes`.
        While the job waits for its batch to commit it does not count against the type's
        `concurrency`: another job starts meanwhile, so the next batch fills.
        """
        if self._finish is not None:  # kept, and applied with the result when it returns
            kept = self._finish.deferred()
            self._writes = kept.writes
            return kept
        block = self._dedup.once_deferred(self.job_id, self.job_type, self.attempt,
                                          while_waiting=self._lend_slot)
        self._writes = block.writes
        return block

    async def enqueue(self, job_type: str, payload: BaseModel | Mapping[str, Any], *,
                      name: str | None = None, key: str | bytes | None = None,
                      priority: str = "default", delay: Seconds | None = None,
                      run_at: datetime | None = None, expires_in: Seconds | None = None,
                      job_id: str | None = None, tenant: str | None = None) -> str:
        """Enqueue a child job in this job's exactly-once transaction: call it inside
        `async with ctx.once():` (or `ctx.once_deferred():`). The child exists if and
        only if the parent's effects and dedup row commit, and the outbox relay sends it.

        Its job ID is derived from this job's ID and `name` (default: the child's
        position among this run's `enqueue` calls, "0", "1", ...), so a parent that runs
        again makes the same children; give distinct names to children you enqueue
        conditionally. A child takes this job's tenant unless given one. The other options
        mean what `JobClient.enqueue`'s do, and every check it makes happens here, before
        anything is written.
        """
        children = self._client_for_children()
        name = self._next_name(name)
        child_id = job_id or child_job_id(self.job_id, name)
        prepared = [self._prepare_child(Job(job_type, payload, key, child_id, priority, delay,
                                            run_at, expires_in, tenant))]
        schema = children.settings.database_schema
        if self._conn is not None:
            await write_async(self._conn, prepared, schema)
        elif self._writes is not None and not self._writes.closed:
            await self._writes.execute(insert_sql(schema, "asyncpg"),
                                       *insert_args(prepared, schema))
        else:
            raise NotInTransaction(
                "ctx.enqueue() writes child jobs in the job's exactly-once transaction: call "
                "it inside `async with ctx.once():` or `async with ctx.once_deferred():`.")
        return child_id

    async def batch(self, jobs: Sequence[Job], *, on_success: Job | None = None,
                    on_complete: Job | None = None, name: str | None = None) -> str:
        """Start a batch in this job's exactly-once transaction (inside `ctx.once()` or
        `ctx.once_deferred()`), as `JobClient.batch` does: it exists, with its members,
        if and only if this job's effects commit. Its ID is derived from this job's ID
        and `name` (default: the position among this run's enqueue/batch/chain calls),
        so a callback that starts a batch starts the same one however often it runs.
        Members and callbacks given no tenant take this job's."""
        children = self._client_for_children()
        workflow_id = workflow_id_for(self.job_id, self._next_name(name))
        plan = batch_plan(children.settings.database_schema, workflow_id, list(jobs),
                          self._prepare_child, on_success=on_success, on_complete=on_complete,
                          parent_job_id=self.job_id)
        return await self._write_plan(plan, "ctx.batch()")

    async def chain(self, *jobs: Job, name: str | None = None) -> str:
        """Start a chain in this job's exactly-once transaction (see `batch`)."""
        children = self._client_for_children()
        workflow_id = workflow_id_for(self.job_id, self._next_name(name))
        plan = chain_plan(children.settings.database_schema, workflow_id, jobs,
                          self._prepare_child, parent_job_id=self.job_id)
        return await self._write_plan(plan, "ctx.chain()")

    def _prepare_child(self, job: Job) -> tuple[str, JobRecord]:
        """A child job's topic and record; a child given no tenant takes this job's."""
        if job.tenant is None and self.tenant is not None:
            job = dataclasses.replace(job, tenant=self.tenant)
        return self._client_for_children().prepare(job)

    def _client_for_children(self) -> JobClient:
        if self._children is None:
            raise ConfigError("This worker has no client for child jobs: make it with "
                              "app.worker(...) (or pass children=app.client()).")
        return self._children

    def _next_name(self, name: str | None) -> str:
        position = self._enqueued
        self._enqueued += 1
        return str(position) if name is None else name

    async def _write_plan(self, plan: Plan, what: str) -> str:
        if self._conn is not None:
            await write_plan(self._conn, plan)
        elif self._writes is not None and not self._writes.closed:
            await record_plan(self._writes, plan)
        else:
            raise NotInTransaction(
                f"{what} writes in the job's exactly-once transaction: call it inside "
                "`async with ctx.once():` or `async with ctx.once_deferred():`.")
        return plan.workflow_id

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
        if self._finish is not None:
            raise ConfigError(
                "ctx.once_sync() commits the handler's own session, which the job's result "
                "or batch counters cannot join: for a type with keep_result, a batch member "
                "or a chain step, write the effects in an `async def` handler with "
                "ctx.once(), or return without once_sync (docs/results.md).")
        return self._dedup.once_sync(session, self.job_id, self.job_type, self.attempt)


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
