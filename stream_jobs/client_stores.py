"""What a client keeps in Postgres besides the jobs it sends: cancels, unique and debounce
keys, kept results, batches and chains, and what a job's status reads.

`JobClient` reaches them through one `ClientStores`: `PostgresStores` (the tables of
`stream_jobs.dedup`, `stream_jobs.outbox.unique` and `stream_jobs.workflows`, each opened
on first use, so a client that uses none never connects), or the in-memory one of
`stream_jobs.testing` while a `JobTester` runs. A caller's own connection (`conn=`) is
not a store: what is written through it goes into the caller's transaction either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel

from stream_jobs.cancels import Cancellation
from stream_jobs.dedup.cancels import CancelStore
from stream_jobs.dedup.pool import LazyPool
from stream_jobs.dedup.results import ResultReader
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.lookup import JobLocation, locate_job
from stream_jobs.outbox.unique import Build, KeyAnswer, enqueue_keyed_own
from stream_jobs.settings import Settings
from stream_jobs.uniqueness import KeyClaim
from stream_jobs.workflows.calls import WorkflowStores
from stream_jobs.workflows.create import Plan, write_plan_alone
from stream_jobs.workflows.progress import Progress, read_progress


class ClientStores(WorkflowStores, Protocol):
    """The client's stores (see the module); each call means what `JobClient`'s says."""

    async def cancel(self, job_id: str, *, job_type: str | None,
                     reason: str | None) -> Cancellation: ...

    async def enqueue_keyed(self, claim: KeyClaim, job_type: str, job_id: str,
                            build: Build) -> KeyAnswer:
        """Take the key and, if this job got it, send the job (`build` makes its record)."""
        ...

    async def status(self, types: Mapping[str, JobTypePolicy], job_id: str, *,
                     job_type: str | None) -> JobLocation: ...

    async def close(self) -> None: ...


class PostgresStores:
    """`ClientStores` on the settings' Postgres."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._cancels: CancelStore | None = None
        self._db: LazyPool | None = None
        self._results: ResultReader | None = None

    async def cancel(self, job_id: str, *, job_type: str | None,
                     reason: str | None) -> Cancellation:
        if self._cancels is None:
            self._cancels = CancelStore(self.settings)
        return await self._cancels.cancel(job_id, job_type=job_type, reason=reason)

    async def enqueue_keyed(self, claim: KeyClaim, job_type: str, job_id: str,
                            build: Build) -> KeyAnswer:
        if self._db is None:
            self._db = LazyPool(self.settings, max_size=4, name="stream-jobs client")
        return await enqueue_keyed_own(self._db, claim, job_type, job_id,
                                       self.settings.database_schema, build)

    async def result(self, job_id: str, timeout_s: float, *, model: type[BaseModel] | None,
                     kept: Mapping[str, float]) -> Any:
        if self._results is None:
            self._results = ResultReader(self.settings)
        return await self._results.result(job_id, timeout_s, model=model, kept=kept)

    async def write_plan(self, plan: Plan) -> None:
        await write_plan_alone(self.settings, plan)

    async def progress(self, workflow_id: str) -> Progress:
        return await read_progress(self.settings, workflow_id)

    async def status(self, types: Mapping[str, JobTypePolicy], job_id: str, *,
                     job_type: str | None) -> JobLocation:
        return await locate_job(self.settings, types, job_id, job_type=job_type)

    async def close(self) -> None:
        """Close what was opened (the stores can be used again afterwards)."""
        if self._results is not None:
            await self._results.close()
            self._results = None
        if self._cancels is not None:
            await self._cancels.close()
            self._cancels = None
        if self._db is not None:
            await self._db.close()
            self._db = None


__all__ = ["ClientStores", "PostgresStores"]
