"""The client's wait for a job's result: `JobClient.result` and `SyncJobClient.result`
take it from here; the stores that answer it are `stream_jobs.client_stores`' (Postgres,
`stream_jobs.results.store`) or a `JobTester`'s memory. docs/results.md.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from stream_jobs.job_types import JobTypePolicy

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class ResultStores(Protocol):
    """Where results are read without a connection of the caller's."""

    async def result(self, job_id: str, timeout_s: float, *, model: type[BaseModel] | None,
                     kept: Mapping[str, float | None],
                     types: Mapping[str, JobTypePolicy]) -> Any:
        """`ResultCalls.result`; `kept` as `JobClient` has it, `types` to look in."""
        ...


class ResultCalls:
    """What `JobClient` has of results (it sets the attributes below)."""

    _types: Mapping[str, JobTypePolicy]
    # The types this app has handlers for: seconds each keeps its results (None: none).
    _kept: Mapping[str, float | None]
    _stores: ResultStores

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


class SyncResultCalls:
    """The same for `SyncJobClient`, blocking (it sets `_client` and `_call`)."""

    _client: ResultCalls

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError

    def result(self, job_id: str, *, timeout: float = 30.0,
               model: type[M] | None = None) -> Any:
        """As `JobClient.result`, blocking until the result is there (or the timeout)."""
        return self._call(self._client.result(job_id, timeout=timeout, model=model))
