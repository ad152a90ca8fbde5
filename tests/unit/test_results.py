"""Results as they are kept: encoding, the size limit, the error of a job that did not
succeed, and what a reader says when Postgres cuts its connection (no services)."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import asyncpg
import pytest
from pydantic import BaseModel

from stream_jobs.errors import (
    DatabaseUnavailable,
    JobCancelled,
    JobExpired,
    JobFailed,
    ResultError,
    ResultTooLarge,
)
from stream_jobs.failures import FailureInfo
from stream_jobs.outcomes import Outcome
from stream_jobs.results.finish import ending_row
from stream_jobs.results.rules import StoredResult, encode_result
from stream_jobs.results.store import ResultReader
from stream_jobs.settings import Settings

WHEN = datetime(2026, 1, 1, tzinfo=UTC)


class Report(BaseModel):
    pages: int
    title: str


def test_models_dicts_and_scalars_encode_as_json() -> None:
    assert encode_result(Report(pages=2, title="q"), job_type="t", max_bytes=100) == \
        '{"pages":2,"title":"q"}'
    assert encode_result({"nested": [Report(pages=1, title="a")]}, job_type="t",
                         max_bytes=100) == '{"nested":[{"pages":1,"title":"a"}]}'
    assert encode_result(None, job_type="t", max_bytes=10) == "null"
    assert encode_result(3, job_type="t", max_bytes=10) == "3"


def test_a_result_over_the_limit_is_refused_whole() -> None:
    assert encode_result("x" * 8, job_type="t", max_bytes=10) == '"xxxxxxxx"'
    with pytest.raises(ResultTooLarge, match="11 bytes as JSON, over the limit of 10"):
        encode_result("x" * 9, job_type="report.build", max_bytes=10)


@pytest.mark.parametrize("value", [{1, 2}, b"bytes", {"k": object()}])
def test_what_json_cannot_hold_is_refused(value: object) -> None:
    with pytest.raises(ResultError, match="not JSON"):
        encode_result(value, job_type="t", max_bytes=1000)


def test_nul_is_refused_before_postgres_sees_it() -> None:
    with pytest.raises(ResultError, match="NUL"):
        encode_result({"s": "a\x00b"}, job_type="t", max_bytes=1000)


def _row(state: str, result: str | None = None, error: str | None = None) -> StoredResult:
    return StoredResult("j1", "report.build", state, result, error, 2, WHEN, WHEN)


def test_a_kept_result_reads_back_as_values_or_a_model() -> None:
    row = _row("succeeded", '{"pages": 3, "title": "x"}')
    assert row.value() == {"pages": 3, "title": "x"}
    assert row.parsed(Report) == Report(pages=3, title="x")
    with pytest.raises(ResultError, match="does not fit Report"):
        _row("succeeded", '{"pages": "many"}').parsed(Report)
    assert row.to_dict()["result"] == {"pages": 3, "title": "x"}


@pytest.mark.parametrize(("state", "error", "words"), [
    ("failed", JobFailed, "was dead-lettered"),
    ("expired", JobExpired, "expired before it ran"),
    ("cancelled", JobCancelled, "was cancelled"),
    ("superseded", JobCancelled, "was superseded by a newer job"),
])
def test_a_job_that_did_not_succeed_says_why(state: str, error: type[Exception],
                                             words: str) -> None:
    failure = _row(state, error="max-attempts: ValueError: boom").failure()
    assert isinstance(failure, error)
    assert f"Job j1 (report.build) {words} after attempt 2: max-attempts" in str(failure)
    assert (failure.state, failure.reason) == (state, "max-attempts: ValueError: boom")
    copy = pickle.loads(pickle.dumps(failure))
    assert (type(copy), copy.state, copy.reason, str(copy)) == (
        type(failure), failure.state, failure.reason, str(failure))


def test_the_row_of_a_job_that_did_not_succeed_records_its_outcome_and_why() -> None:
    failure = FailureInfo(reason="max-attempts", error_class="ValueError", message="boom",
                          traceback="", failed_at_ms=1)
    assert ending_row(Outcome.DEAD_LETTERED, failure) == (
        "failed", "max-attempts: ValueError: boom")
    assert ending_row(Outcome.EXPIRED, None) == ("expired", "expired before it ran")
    assert ending_row(Outcome.CANCELLED, None) == ("cancelled", "cancelled")
    assert ending_row(Outcome.SUPERSEDED, None) == (
        "superseded", "superseded by a newer job of its debounce key")
    for recorded_elsewhere in (Outcome.SUCCEEDED, Outcome.RETRIED, Outcome.DUPLICATE):
        assert ending_row(recorded_elsewhere, None) is None


async def test_a_connection_cut_by_a_postgres_restart_is_database_unavailable() -> None:
    # Found by the results chaos trial: asyncpg's pool resetting a connection the server
    # had just cut raised InternalClientError ("cannot switch to state 15") out of
    # `client.result`, instead of the DatabaseUnavailable a caller retries on.
    class CutPool:
        async def fetchrow(self, *_: object) -> None:
            raise asyncpg.InternalClientError(
                "cannot switch to state 15; another operation (2) is in progress")

    reader = ResultReader(Settings(database_url="postgresql://u:secret@127.0.0.1:1/db"))
    reader._pool = CutPool()  # type: ignore[assignment]
    with pytest.raises(DatabaseUnavailable, match="did not answer") as raised:
        await reader.fetch("j1")
    assert "secret" not in str(raised.value)
