"""The pure parts of cancel: notices on the wire, the answer for a lookup's status, reasons."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.cancels.rules import (
    CancelAnswer,
    Cancellation,
    Notice,
    NoticeKind,
    channel,
    checked_reason,
    concerns,
    notice,
    parse_notice,
    verdict_of,
)
from stream_jobs.errors import ConfigError
from stream_jobs.lookup import Status
from stream_jobs.tools.type_stats import OutcomeCounts, Rates

types = st.text(st.characters(codec="utf-8", exclude_characters="\t\x00"), max_size=30)
ids = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=64)


@given(st.sampled_from(NoticeKind), types, ids)
def test_a_notice_reads_back_as_it_was_written(kind: NoticeKind, job_type: str,
                                               job_id: str) -> None:
    assert parse_notice(notice(kind, job_type, job_id)) == Notice(kind, job_type, job_id)


@given(st.text(max_size=80))
def test_any_payload_is_a_notice_or_none_never_an_error(payload: str) -> None:
    found = parse_notice(payload)
    assert found is None or isinstance(found.kind, NoticeKind)


@pytest.mark.parametrize("payload", ["", "cancel", "cancel\tt", "cancel\tt\t", "stop\tt\tid"])
def test_payloads_that_are_not_notices(payload: str) -> None:
    assert parse_notice(payload) is None


def test_a_cancel_without_a_type_concerns_every_type() -> None:
    assert concerns("", "email.send")
    assert concerns("email.send", "email.send")
    assert not concerns("image.resize", "email.send")


def test_channels_fit_postgres_identifiers_and_differ_by_schema() -> None:
    assert channel("public") == "stream_jobs_cancel.public"
    long_a, long_b = channel("a" * 60), channel("a" * 59 + "b")
    assert len(long_a.encode()) <= 63
    assert long_a != long_b


def test_every_lookup_status_has_a_verdict_but_not_seen() -> None:
    statuses = set(get_args(Status))
    finished = {"done", "finished", "dead_lettered", "superseded"}
    assert statuses == {*finished, "cancelled", "pending", "running", "retrying", "scheduled",
                        "not_seen"}
    for status in finished:
        assert verdict_of(status) is CancelAnswer.ALREADY_FINISHED
    assert verdict_of("cancelled") is CancelAnswer.ALREADY_CANCELLED
    assert verdict_of("pending") is None
    assert verdict_of("running") is None
    assert verdict_of("retrying") is None
    assert verdict_of("scheduled") is None
    with pytest.raises(ValueError, match="not_seen"):
        verdict_of("not_seen")


def test_reasons_are_stripped_and_bounded() -> None:
    assert checked_reason(None) is None
    assert checked_reason("   ") is None
    assert checked_reason(" duplicate order ") == "duplicate order"
    with pytest.raises(ConfigError, match="at most 500 characters"):
        checked_reason("x" * 501)


def test_each_answer_reads_as_a_sentence() -> None:
    done = Cancellation("j1", CancelAnswer.ALREADY_FINISHED, "t", detail="Attempt 1 committed.")
    assert done.summary() == "Job j1 (t) already finished; nothing changed. Attempt 1 committed."
    assert not done.changed
    cancelled = Cancellation("j2", CancelAnswer.CANCELLED)
    assert cancelled.changed
    assert cancelled.summary().startswith("Job j2 is cancelled: it will not start")


def test_stats_count_cancelled_and_superseded_like_the_other_outcomes() -> None:
    counts = OutcomeCounts.of({"succeeded": 5, "duplicate": 1, "cancelled": 3,
                               "superseded": 7, "retried": 2})
    assert counts == OutcomeCounts(done=6, retried=2, cancelled=3, superseded=7)
    assert counts.total == 18
    assert (counts + counts).since(counts) == counts
    assert Rates(10.0, counts).per_s()["cancelled"] == 0.3
