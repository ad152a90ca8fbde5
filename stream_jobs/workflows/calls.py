"""The client's calls for results, chains and batches: `JobClient` and `SyncJobClient`
take them from here (their own module keeps the client's to enqueueing and cancels).

`result` waits for a kept result (docs/results.md); `chain` and `batch` make workflows
whose next steps and callbacks are written exactly once, and `progress` says where one
stands (docs/workflows.md).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from stream_jobs.job_ids import new_job_id
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from stream_jobs.workflows.create import JobSpec, Plan, batch_plan, chain_plan, write_plan
from stream_jobs.workflows.progress import Progress

# A `stream_jobs.client.Job` (the client is above this module: it is named by what is read).
Job = JobSpec

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class WorkflowStores(Protocol):
    """Where results are read and workflows written without a connection of the caller's:
    Postgres (`stream_jobs.client_stores`), or a `JobTester`'s memory."""

    async def result(self, job_id: str, timeout_s: float, *, model: type[BaseModel] | None,
                     kept: Mapping[str, float | None],
                     types: Mapping[str, JobTypePolicy]) -> Any:
        """`WorkflowCalls.result`; `kept` as `JobClient` has it, `types` to look in."""
        ...

    async def write_plan(self, plan: Plan) -> None:
        """Run `plan` in a transaction of its own."""
        ...

    async def progress(self, workflow_id: str) -> Progress: ...


class WorkflowCalls:
    """What `JobClient` has of results and workflows (it sets the attributes below)."""

    settings: Settings
    _types: Mapping[str, JobTypePolicy]
    # The types this app has handlers for: seconds each keeps its results (None: none).
    _kept: Mapping[str, float | None]
    _stores: WorkflowStores
    prepare: Callable[[Any], tuple[str, JobRecord]]

    # `timeout` is the contract's name (DESIGN.md): a wait bounded by the call itself.
    async def result(self, job_id: str, *, timeout: float = 30.0,  # noqa: ASYNC109
                     model: type[M] | None = None) -> Any:
        """The job's kept result, waiting up to `timeout` seconds (woken by the worker's
        commit, not by polling), validated by `model` if given. Raises `JobFailed`
        (dead-lettered), `JobCancelled` or `JobExpired` with the reason; `ResultNotKept`
        when the job finished and no result of it is kept, or, not finished, when none
        will be (its type's handler in this app has no `keep_result`); `ResultTimeout`,
        saying where the job is, when it has not finished in time. A job without a row
        is looked for as `stream-jobs job` does (docs/results.md says when)."""
        return await self._stores.result(job_id, timeout, model=model, kept=self._kept,
                                         types=self._types)

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

    def result(self, job_id: str, *, timeout: float = 30.0,
               model: type[M] | None = None) -> Any:
        """As `JobClient.result`, blocking until the result is there (or the timeout)."""
        return self._call(self._client.result(job_id, timeout=timeout, model=model))

    def chain(self, *jobs: Job, chain_id: str | None = None) -> str:
        return self._call(self._client.chain(*jobs, chain_id=chain_id))

    def batch(self, jobs: Iterable[Job], *, on_success: Job | None = None,
              on_complete: Job | None = None, batch_id: str | None = None) -> str:
        return self._call(self._client.batch(list(jobs), on_success=on_success,
                                             on_complete=on_complete, batch_id=batch_id))

    def progress(self, workflow_id: str) -> Progress:
        return self._call(self._client.progress(workflow_id))


__all__ = ["SyncWorkflowCalls", "WorkflowCalls", "WorkflowStores"]
