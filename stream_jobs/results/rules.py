"""Job results as they are kept: a handler's return value as JSON, and a job's last state.

A type declared with `@app.job(..., keep_result="1d")` keeps what its handler returns in
`stream_jobs_results`, written in the same transaction as the job's dedup row (see
`stream_jobs.results.finish`). A job that ends without succeeding (dead-lettered,
expired, cancelled) gets a row too, with its state and the reason, so a caller waiting
in `client.result` hears why instead of waiting out its timeout. Pure: no database here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from stream_jobs.errors import (
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotSucceeded,
    ResultError,
    ResultTooLarge,
)

ResultState = Literal["succeeded", "failed", "expired", "cancelled", "superseded"]
# The states a job can end in without a result, and the error `client.result` raises.
_NOT_SUCCEEDED: dict[str, type[JobNotSucceeded]] = {
    "failed": JobFailed, "expired": JobExpired, "cancelled": JobCancelled,
    "superseded": JobCancelled,
}
STATES: tuple[ResultState, ...] = ("succeeded", "failed", "expired", "cancelled", "superseded")

M = TypeVar("M", bound=BaseModel)


def encode_result(value: object, *, job_type: str, max_bytes: int) -> str:
    """`value` as JSON text for the results table: a pydantic model (`model_dump`, JSON
    mode), or anything orjson writes (dicts, lists, str, numbers, None).

    Raises `ResultTooLarge` over `max_bytes` (never truncated) and `ResultError` for a
    value JSON cannot hold; either fails the job, which then retries or dead-letters.
    """
    try:
        plain = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        data = orjson.dumps(plain, default=_nested)
    except (TypeError, ValueError) as exc:
        raise ResultError(f"The {job_type} handler returned a value that is not JSON "
                          f"({exc}): return a dict, a list, a scalar or a pydantic model.") \
            from exc
    if len(data) > max_bytes:
        raise ResultTooLarge(
            f"The {job_type} result is {len(data):,} bytes as JSON, over the limit of "
            f"{max_bytes:,} (STREAM_JOBS_MAX_RESULT_BYTES): keep large results elsewhere "
            "and return a reference to them.")
    if b"\\u0000" in data:
        # Postgres' jsonb cannot hold NUL; refused here with a sentence, not at commit.
        raise ResultError(f"The {job_type} result holds a NUL character (\\u0000), which "
                          "Postgres cannot store: remove it, or encode binary data.")
    return data.decode()


def _nested(obj: object) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


@dataclass(frozen=True)
class StoredResult:
    """A row of `stream_jobs_results`: how the job ended, and its result if it succeeded."""

    job_id: str
    job_type: str
    state: str
    result_json: str | None  # JSON text; None when the job did not succeed or kept none
    error: str | None  # why it did not succeed: the dead letter's reason, error and message
    attempt: int
    finished_at: datetime
    expires_at: datetime

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    def value(self) -> Any:
        """The result as Python values (None for a JSON null or no result)."""
        return None if self.result_json is None else orjson.loads(self.result_json)

    def parsed(self, model: type[M]) -> M:
        """The result validated by `model`; `ResultError` when it does not fit."""
        try:
            return model.model_validate_json(self.result_json or "null")
        except ValidationError as exc:
            raise ResultError(f"The result of job {self.job_id} does not fit "
                              f"{model.__name__}: {exc.error_count()} problem(s), e.g. "
                              f"{exc.errors()[0]['msg']}.") from None

    def failure(self) -> JobNotSucceeded:
        """The error for a job that did not succeed, with its state and reason."""
        cls = _NOT_SUCCEEDED.get(self.state, JobFailed)
        what = {"failed": "was dead-lettered", "expired": "expired before it ran",
                "cancelled": "was cancelled", "superseded": "was superseded by a newer job"}
        because = f": {self.error}" if self.error else ""
        # Attempt 0: no run of it ever started (cancelled where it waited).
        after = f" after attempt {self.attempt}" if self.attempt else ""
        return cls(f"Job {self.job_id} ({self.job_type}) "
                   f"{what.get(self.state, 'ended as ' + self.state)}{after}{because}.",
                   job_id=self.job_id, state=self.state, reason=self.error)

    def answer(self, model: type[M] | None = None) -> Any:
        """What `client.result` returns for this row: the result (validated by `model` if
        given), or, for a job that did not succeed, its error raised."""
        if not self.succeeded:
            raise self.failure()
        return self.parsed(model) if model is not None else self.value()

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "job_type": self.job_type, "state": self.state,
                "result": self.value() if self.succeeded else None, "error": self.error,
                "attempt": self.attempt, "finished_at": self.finished_at.isoformat(),
                "expires_at": self.expires_at.isoformat()}


__all__ = ["STATES", "ResultState", "StoredResult", "encode_result"]
