"""The pure half of the DLQ tools (`stream_jobs.dlq.letters`), and CLI mistakes caught early."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.dlq.letters import (
    UNKNOWN_REASON,
    LetterRow,
    Verdict,
    judge,
    parse_since,
    read_letter,
    requeued_record,
)
from stream_jobs.dlq.requeue import chunk_size
from stream_jobs.errors import ConfigError
from stream_jobs.failures import FailureInfo
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.record import JobRecord, dead_letter_headers

NOW = 1_700_000_000_000
FAILURE = FailureInfo("max-attempts", "RuntimeError", "down\nsecond line", "Traceback...", NOW)


@dataclass
class FakeRecord:
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = field(default_factory=list)
    key: bytes | None = None
    topic: str = "jobs.t.dlq"
    partition: int = 1
    offset: int = 7
    timestamp: int = NOW + 5


def _job(**changes: object) -> JobRecord:
    base = JobRecord(job_id="j-1", job_type="t", payload=b'{"a": 1}', key=b"k", attempt=4,
                     enqueued_at_ms=NOW - 10, lane="high", origin="jobs.t/0/3", failure=FAILURE,
                     requeues=1, not_before_ms=NOW - 5)
    return base.with_(**changes)  # type: ignore[arg-type]


def test_a_decodable_letter_is_read_with_its_job() -> None:
    job = _job()
    letter = read_letter(FakeRecord(job.payload, job.headers(), job.key), "t", 1000)
    assert letter.job == job
    assert (letter.job_id, letter.reason, letter.attempt, letter.requeues) == ("j-1",
                                                                               "max-attempts", 4, 1)
    assert letter.failed_at_ms == NOW
    assert letter.problem is None
    assert (letter.partition, letter.offset) == (1, 7)


def test_an_undecodable_letter_is_read_from_its_headers() -> None:
    failure = FailureInfo("bad-json", "BadRecord", "not JSON", "", NOW)
    headers = dead_letter_headers([("sj-type", b"t"), ("sj-attempt", b"many"),
                                   ("sj-requeues", b"2")],
                                  failure=failure, origin="jobs.t/0/1", job_type="t")
    letter = read_letter(FakeRecord(b"\x00\xff", headers), "t", 1000)
    assert letter.job is None
    assert letter.problem == "bad-header"  # the garbled attempt is checked before the JSON
    assert letter.reason == "bad-json"
    assert letter.job_id  # the worker gave it one
    assert letter.attempt is None
    assert letter.requeues == 2
    assert letter.origin == "jobs.t/0/1"


def test_a_letter_without_headers_is_still_a_letter() -> None:
    letter = read_letter(FakeRecord(None, []), "t", 1000)
    assert (letter.job_id, letter.reason, letter.problem) == ("", UNKNOWN_REASON, "missing-value")
    assert letter.failed_at_ms == NOW + 5  # the record's time stands in


@given(value=st.one_of(st.none(), st.binary(max_size=64)),
       headers=st.lists(st.tuples(st.sampled_from(["sj-job-id", "sj-type", "sj-attempt",
                                                   "sj-requeues", "sj-error", "sj-lane", "x"]),
                                  st.binary(max_size=16)), max_size=8))
def test_reading_a_letter_never_raises(value: bytes | None,
                                       headers: list[tuple[str, bytes]]) -> None:
    letter = read_letter(FakeRecord(value, headers), "t", 32)
    LetterRow.of(letter)
    assert letter.requeues >= 0


def test_verdicts() -> None:
    ok = read_letter(FakeRecord(b'{"a": 1}', _job(requeues=2).headers()), "t", 1000)
    assert judge(ok, force=False, max_requeues=3, now_ms=NOW) == Verdict.REQUEUE
    guarded = read_letter(FakeRecord(b"{}", _job(requeues=3).headers()), "t", 1000)
    assert judge(guarded, force=False, max_requeues=3, now_ms=NOW) == Verdict.LOOP_GUARD
    assert judge(guarded, force=True, max_requeues=3, now_ms=NOW) == Verdict.REQUEUE
    expired = read_letter(FakeRecord(b"{}", _job(expires_at_ms=NOW).headers()), "t", 1000)
    assert judge(expired, force=False, max_requeues=3, now_ms=NOW) == Verdict.EXPIRED
    assert judge(expired, force=True, max_requeues=3, now_ms=NOW) == Verdict.REQUEUE
    bad = read_letter(FakeRecord(b"nope", _job().headers()), "t", 1000)
    assert judge(bad, force=True, max_requeues=3, now_ms=NOW) == Verdict.UNDECODABLE


def test_a_requeued_record_runs_as_the_next_attempt_with_its_history_cleared() -> None:
    policy = JobTypePolicy("t", priorities=("high", "default"))
    lane, record = requeued_record(_job(), policy, reset_attempts=False, now_ms=NOW)
    assert lane == "high"
    assert record == _job().with_(attempt=5, failure=None, not_before_ms=None, requeues=2)
    assert dict(record.headers()).keys() >= {"sj-job-id", "sj-requeues", "sj-origin"}
    assert "sj-error" not in dict(record.headers())
    assert "sj-not-before" not in dict(record.headers())
    _, reset = requeued_record(_job(), policy, reset_attempts=True, now_ms=NOW)
    assert reset.attempt == 1


def test_a_requeued_record_goes_to_a_declared_lane_and_loses_only_a_past_expiry() -> None:
    policy = JobTypePolicy("t")  # only the default lane
    lane, record = requeued_record(_job(expires_at_ms=NOW + 60_000), policy,
                                   reset_attempts=False, now_ms=NOW)
    assert (lane, record.lane, record.expires_at_ms) == ("default", "default", NOW + 60_000)
    _, forced = requeued_record(_job(expires_at_ms=NOW - 1), policy, reset_attempts=False,
                                now_ms=NOW)
    assert forced.expires_at_ms is None


def test_since_takes_a_duration_ago_or_an_iso_time() -> None:
    assert parse_since("1h", NOW) == NOW - 3_600_000
    assert parse_since(" 90s ", NOW) == NOW - 90_000
    assert parse_since("30m ago", NOW) == NOW - 1_800_000
    assert parse_since("2023-11-14T22:13:20Z", NOW) == NOW
    assert parse_since("2023-11-14T22:13:20", NOW) == NOW  # UTC when no offset is given
    assert parse_since("2023-11-14T23:13:20+01:00", NOW) == NOW
    for bad in ("yesterday", "5", "", "1 fortnight"):
        with pytest.raises(ConfigError, match="neither an ISO time"):
            parse_since(bad, NOW)


def test_rows_carry_a_short_message() -> None:
    row = LetterRow.of(read_letter(FakeRecord(b"{}", _job(failure=FAILURE.__class__(
        "timeout", "TimeoutError", "x" * 300 + "\nmore", "", NOW)).headers()), "t", 1000))
    assert len(row.message) == 100
    assert row.message.endswith("…")
    blank = LetterRow.of(read_letter(FakeRecord(b"{}", _job(failure=FAILURE.__class__(
        "timeout", "TimeoutError", "  \n ", "", NOW)).headers()), "t", 1000))
    assert blank.message == ""


def test_chunks_are_small_when_paced() -> None:
    assert chunk_size(None) == 500
    assert chunk_size(100.0) == 20
    assert chunk_size(0.5) == 1
    assert chunk_size(1e6) == 500


@pytest.mark.parametrize(("args", "words"), [
    (["dlq", "requeue", "t.x"], ["exactly one of --all"]),
    (["dlq", "requeue", "t.x", "--all", "--reason", "timeout"], ["not --all and --reason"]),
    (["dlq", "requeue", "t.x", "--all", "--rate", "fast"], ["'fast' is not a rate"]),
    (["dlq", "requeue", "t.x", "--all", "--rate", "0"], ["above zero"]),
    (["dlq", "list", "t.x", "--since", "soon"], ["--since 'soon'"]),
])
def test_cli_mistakes_are_one_sentence(args: list[str], words: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from stream_jobs.cli import main

    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: ")
    assert all(word in err[0] for word in words)
