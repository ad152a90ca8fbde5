"""Retry now, the pure part: who may be released early, and which lane record is the
original that must not run."""

from __future__ import annotations

import pytest

from stream_jobs.cancels.rules import (
    NoticeKind,
    notice,
    parse_notice,
    released_key,
    released_text,
)
from stream_jobs.record import JobRecord
from stream_jobs.retry_now.rules import EARLY_MARK, refusal, released_original


def headers(attempt: int = 2, requeues: int = 0, job_id: str = "j1") -> list[tuple[str, bytes]]:
    return JobRecord(job_id, "t", b"{}", None, attempt=attempt, requeues=requeues).headers()


def test_the_original_of_a_released_attempt_is_found_and_the_copy_is_not() -> None:
    released = {("j1", 0, 2)}
    assert released_original(headers(), released)
    assert not released_original([*headers(), EARLY_MARK], released)
    assert not released_original(headers(attempt=3), released)  # a later attempt runs
    assert not released_original(headers(requeues=1), released)  # a later round runs
    assert not released_original(headers(job_id="j2"), released)
    assert not released_original([], released)


@pytest.mark.parametrize(("status", "said"), [
    ("done", "is done, not waiting in a delay tier"),
    ("pending", "is pending (or running), not waiting"),
    ("dead_lettered", "is dead-lettered (requeue it instead)"),
    ("cancelled", "is cancelled"),
])
def test_only_a_job_waiting_in_a_tier_may_be_retried_now(status: str, said: str) -> None:
    assert refusal("j1", "retrying") is None
    assert refusal("j1", "scheduled") is None
    why = refusal("j1", status)
    assert why is not None
    assert said in why
    assert why.startswith("Job j1 ")


def test_the_notice_of_an_early_release_round_trips_with_any_job_id() -> None:
    for job_id in ("j1", "a\tb", "x" * 64):
        text = notice(NoticeKind.RELEASED, "email.send", released_text((job_id, 3, 7)))
        found = parse_notice(text)
        assert found is not None
        assert found.kind is NoticeKind.RELEASED
        assert released_key(found.job_id) == (job_id, 3, 7)
    assert released_key("x\t1\tj") is None
    assert released_key("1\t2\t") is None
