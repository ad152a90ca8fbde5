"""What a client keeps in Postgres besides the jobs it sends: cancels, unique and debounce
keys, kept results, batches and chains, and what a job's status reads.

`JobClient` reaches them through one `ClientStores`: `PostgresStores` (the tables of
`stream_jobs.dedup`, `stream_jobs.unique.claim` and `stream_jobs.workflows`, each opened
on first use, so a client that uses none never connects), or the in-memory one of
`stream_jobs.testing` while a `JobTester` runs. A caller's own connection (`conn=`) is
not a store: what is written through it goes into the caller's transaction either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel

from stream_jobs.cancels.rules import Cancellation
from stream_jobs.cancels.store import CancelStore
from stream_jobs.errors import StreamJobsError
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.lookup import JobLocation, keeps_result, locate_job, not_in_time, result_error
from stream_jobs.postgres.pool import LazyPool
from stream_jobs.results.rules import StoredResult
from stream_jobs.results.store import ResultReader
from stream_jobs.settings import Settings
from stream_jobs.unique.claim import Build, KeyAnswer, enqueue_keyed_own
from stream_jobs.unique.rules import KeyClaim
from stream_jobs.workflows.calls import WorkflowStores
from stream_jobs.workflows.create import Plan, write_plan_alone
from stream_jobs.workflows.progress import Progress, read_progress

# `result` waits this long for the job's row before it first looks where the job is: the
# lookup's scan costs more than the wait, and a job that keeps its result usually
# finishes (and wakes the wait) sooner.
LOOK_AFTER_S = 1.0
# Later looks, at a job that may end without writing a row (its type's handler is not in
# this app, or it is not seen yet), come at doubling intervals up to this.
LOOK_EVERY_MAX_S = 8.0


class ResultSource(Protocol):
    """What `await_result` reads: a store's rows of kept results and its job lookup."""

    async def row(self, job_id: str, wait_s: float) -> StoredResult | None:
        """The job's row of kept results, waiting up to `wait_s` for it to be written."""
        ...

    async def locate(self, job_id: str, job_type: str | None) -> JobLocation:
        """Where the job is (`stream_jobs.lookup.locate_job`)."""
        ...

    def idle(self) -> bool:
        """Whether nothing can change now (a `JobTester` between its runs)."""
        ...


async def await_result(source: ResultSource, job_id: str, timeout_s: float, *,
                       kept: Mapping[str, float | None],
                       model: type[BaseModel] | None = None) -> Any:
    """`JobClient.result`: the job's row once it is written (woken by its commit), and,
    while there is none, what the job lookup tells (`stream_jobs.lookup.result_error`):
    how the job ended without a row, or that no row will come, raised as soon as it is
    known; `ResultTimeout` saying where the job is when `timeout_s` passed first.

    The first look comes after `LOOK_AFTER_S` of waiting for the row (at once with
    `timeout_s=0`); a job whose row will come is looked at again only at the deadline,
    and one that may end without one, or whose rows Postgres did not let the lookup read,
    at doubling intervals (`LOOK_EVERY_MAX_S` at most).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + max(0.0, timeout_s)
    gap = LOOK_AFTER_S
    look_at = min(deadline, started + gap)
    job_type: str | None = None
    while True:
        found = await source.row(job_id, max(0.0, look_at - loop.time()))
        location: JobLocation | None = None
        problem = ""
        if found is None:
            try:
                location = await source.locate(job_id, job_type)
            except StreamJobsError as exc:  # Kafka not answering: the row may still come
                problem = str(exc)
            else:
                found = location.result
        if found is not None:
            return found.answer(model)
        if location is not None:
            error = result_error(location, kept)
            if error is not None:
                raise error
            job_type = location.job_type or job_type
        now = loop.time()
        if now >= deadline or source.idle():
            raise not_in_time(job_id, now - started, location, problem)
        if location is not None and location.rows_read and keeps_result(location, kept):
            look_at = deadline  # its row wakes the wait; a last look says where it is
        else:
            gap = min(2 * gap, LOOK_EVERY_MAX_S)
            look_at = min(deadline, now + gap)


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
                     kept: Mapping[str, float | None],
                     types: Mapping[str, JobTypePolicy]) -> Any:
        if self._results is None:
            self._results = ResultReader(self.settings)
        source = _PostgresResults(self.settings, self._results, types)
        return await await_result(source, job_id, timeout_s, kept=kept, model=model)

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


class _PostgresResults:
    """The `ResultSource` of `PostgresStores`: the results table, and the job lookup
    on the settings' Kafka and Postgres."""

    def __init__(self, settings: Settings, reader: ResultReader,
                 types: Mapping[str, JobTypePolicy]) -> None:
        self._settings = settings
        self._reader = reader
        self._types = types

    async def row(self, job_id: str, wait_s: float) -> StoredResult | None:
        return await self._reader.wait(job_id, wait_s)

    async def locate(self, job_id: str, job_type: str | None) -> JobLocation:
        return await locate_job(self._settings, self._types, job_id, job_type=job_type)

    def idle(self) -> bool:
        return False


__all__ = ["LOOK_AFTER_S", "LOOK_EVERY_MAX_S", "ClientStores", "PostgresStores",
           "ResultSource", "await_result"]
