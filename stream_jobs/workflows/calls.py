"""The client's calls for chains and batches: `JobClient` and `SyncJobClient` take them
from here (their own module keeps the client's to enqueueing and cancels, and
`stream_jobs.results.calls` the wait for a result).

`chain` and `batch` make workflows whose next steps and callbacks are written exactly
once, and `progress` says where one stands (docs/workflows.md).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from stream_jobs.job_ids import new_job_id
from stream_jobs.record import JobRecord
from stream_jobs.results.calls import ResultStores
from stream_jobs.settings import Settings
from stream_jobs.workflows.create import JobSpec, Plan, batch_plan, chain_plan, write_plan
from stream_jobs.workflows.progress import Progress

# A `stream_jobs.client.Job` (the client is above this module: it is named by what is read).
Job = JobSpec

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class WorkflowStores(ResultStores, Protocol):
    """Where workflows are written and read without a connection of the caller's (and
    results read): Postgres (`stream_jobs.client_stores`), or a `JobTester`'s memory."""

    async def write_plan(self, plan: Plan) -> None:
        """Run `plan` in a transaction of its own."""
        ...

    async def progress(self, workflow_id: str) -> Progress: ...


class WorkflowCalls:
    """What `JobClient` has of workflows (it sets the attributes below)."""

    settings: Settings
    _stores: WorkflowStores
    prepare: Callable[[Any], tuple[str, JobRecord]]

    async def chain(self, *jobs: Job, chain_id: str | None = None, conn: Any = None) -> str:
        """Run `jobs` one after another: each is enqueued when the one before succeeded,
        with its result in `ctx.parent_result`; a dead-lettered step stops the chain.
        Written in one transaction (the caller's asyncpg `conn`, or the client's own);
        returns the chain's ID."""
        plan = chain_plan(self.settings.database_schema, chain_id or new_job_id(), jobs,
                          self.prepare)
        return await self._write(plan, conn)

    async def batch(self, jobs: Iterable[Job], *, on_success: Job | None = None,
                    on_complete: Job | None = None, batch_id: str | None = None,
                    conn: Any = None) -> str:
        """Enqueue `jobs` as a batch: `on_success` runs once when every member succeeded,
        `on_complete` once when every member finished (dead letters included), whatever
        the retries and redeliveries; a callback's payload gets the counts under
        `"batch"`. Written as `chain` is; returns the batch's ID."""
        plan = batch_plan(self.settings.database_schema, batch_id or new_job_id(), list(jobs),
                          self.prepare, on_success=on_success, on_complete=on_complete)
        return await self._write(plan, conn)

    async def progress(self, workflow_id: str) -> Progress:
        """Where a batch or chain stands (`UnknownWorkflow` if there is none)."""
        return await self._stores.progress(workflow_id)

    async def _write(self, plan: Plan, conn: Any) -> str:
        if conn is not None:
            await write_plan(conn, plan)  # the caller's transaction
        else:
            await self._stores.write_plan(plan)
        return plan.workflow_id


class SyncWorkflowCalls:
    """The same for `SyncJobClient`, blocking (it sets `_client` and `_call`)."""

    _client: WorkflowCalls

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError

    def chain(self, *jobs: Job, chain_id: str | None = None) -> str:
        return self._call(self._client.chain(*jobs, chain_id=chain_id))

    def batch(self, jobs: Iterable[Job], *, on_success: Job | None = None,
              on_complete: Job | None = None, batch_id: str | None = None) -> str:
        return self._call(self._client.batch(list(jobs), on_success=on_success,
                                             on_complete=on_complete, batch_id=batch_id))

    def progress(self, workflow_id: str) -> Progress:
        return self._call(self._client.progress(workflow_id))


__all__ = ["SyncWorkflowCalls", "WorkflowCalls", "WorkflowStores"]
