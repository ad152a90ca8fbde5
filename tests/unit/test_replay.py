"""The pure parts of replay: times, lane targets, selections, the rewritten record, resuming."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.errors import ConfigError
from stream_jobs.failures import FailureInfo
from stream_jobs.kafka.scan import PartitionRange
from stream_jobs.record import JobRecord
from stream_jobs.tools.replay import (
    Pace,
    ReplayResult,
    check_selection,
    parse_lane_target,
    parse_time_ms,
    replayed,
    resume_hint,
)

NOW_MS = 1_714_532_400_000  # 2024-05-01T03:00:00Z


@pytest.mark.parametrize(("text", "expected"), [
    ("2024-05-01T03:00:00Z", NOW_MS),
    ("2024-05-01T03:00:00", NOW_MS),  # no zone: UTC
    ("2024-05-01T05:00:00+02:00", NOW_MS),
    ("2024-05-01 03:00:00.250Z", NOW_MS + 250),
    ("2024-05-01", NOW_MS - 3 * 3_600_000),
    ("2h", NOW_MS - 2 * 3_600_000),
    ("30m ago", NOW_MS - 30 * 60_000),
    (" 90s ", NOW_MS - 90_000),
])
def test_times_are_iso_8601_or_a_duration_ago(text: str, expected: int) -> None:
    assert parse_time_ms(text, now_ms=NOW_MS) == expected


@pytest.mark.parametrize("text", ["yesterday", "", "5", "2024-13-01", "-2h", "2 hours"])
def test_a_malformed_time_is_one_sentence(text: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a time: write ISO 8601 .* such as 2h\.$"):
        parse_time_ms(text, now_ms=NOW_MS)


def test_lane_targets() -> None:
    assert parse_lane_target("email.send") == ("email.send", None)
    assert parse_lane_target("email.send:high") == ("email.send", "high")
    for bad in ("", ":high", "email.send:"):
        with pytest.raises(ConfigError, match="TYPE or TYPE:priority"):
            parse_lane_target(bad)


@pytest.mark.parametrize(("selection", "message"), [
    ({}, "Say where to start"),
    ({"from_offset": 3}, "give --partition"),
    ({"partition": -1, "from_offset": 0}, "partitions count from 0"),
    ({"partition": 0, "from_offset": -1}, "--from-offset -1 is negative"),
    ({"partition": 0, "from_offset": 5, "to_offset": 4}, "--to-offset 4 is before --from-offset 5"),
    ({"from_time_ms": 10, "to_time_ms": 9}, "--to-time is before --from-time"),
])
def test_selections_that_cannot_be_meant(selection: dict[str, int], message: str) -> None:
    given_ = {"partition": None, "from_offset": None, "to_offset": None, "from_time_ms": None,
              "to_time_ms": None, **selection}
    with pytest.raises(ConfigError, match=message):
        check_selection(**given_)


def test_time_ranges_need_no_partition() -> None:
    check_selection(partition=None, from_offset=None, to_offset=None, from_time_ms=1,
                    to_time_ms=None)
    check_selection(partition=2, from_offset=7, to_offset=None, from_time_ms=None,
                    to_time_ms=99)


DEAD = JobRecord(job_id="job-1", job_type="email.send", payload=b'{"to": "a@b"}', key=b"user-42",
                 attempt=4, enqueued_at_ms=1_000, not_before_ms=NOW_MS + 60_000,
                 expires_at_ms=NOW_MS + 3_600_000, lane="low", origin="jobs.email.send/0/7",
                 failure=FailureInfo("max-attempts", "ValueError", "boom", "", 5), requeues=1,
                 traceparent="00-abc-def-01")


def test_a_replay_keeps_the_job_id_and_starts_afresh() -> None:
    out = replayed(DEAD, job_type="email.send", lane="default", rerun=False, now_ms=NOW_MS)
    assert out == DEAD.with_(attempt=1, not_before_ms=None, failure=None, lane="default")


def test_a_rerun_is_a_new_job_that_names_the_original() -> None:
    out = replayed(DEAD, job_type="email.resend", lane="high", rerun=True, now_ms=NOW_MS,
                   new_id=lambda: "job-2")
    assert out == JobRecord(
        job_id="job-2", job_type="email.resend", payload=DEAD.payload, key=b"user-42",
        attempt=1, enqueued_at_ms=NOW_MS, not_before_ms=None, expires_at_ms=DEAD.expires_at_ms,
        lane="high", origin=None, failure=None, requeues=1, rerun_of="job-1",
        traceparent="00-abc-def-01")


def _result(rerun: bool = False) -> ReplayResult:
    return ReplayResult("jobs.t", [PartitionRange(0, 10, 20), PartitionRange(1, 0, 5),
                                   PartitionRange(2, 3, 3)], "each job's lane", rerun, False)


def test_resume_points_follow_what_was_acknowledged() -> None:
    result = _result()
    assert result.planned == 15
    assert result.resume_offsets() == {0: 10, 1: 0}
    result.done_through = {0: 14}
    assert result.resume_offsets() == {0: 15, 1: 0}
    result.done_through = {0: 19, 1: 4}
    assert result.resume_offsets() == {}
    assert resume_hint(result) == "Every record of the range was written."


@given(st.dictionaries(st.integers(0, 2), st.integers(-1, 25)))
def test_a_resume_point_is_inside_its_range(done: dict[int, int]) -> None:
    result = _result()
    result.done_through = done
    spans = {part.partition: part for part in result.selected}
    for partition, offset in result.resume_offsets().items():
        assert spans[partition].start <= offset < spans[partition].end
        assert offset > done.get(partition, -1)


def test_the_resume_hint_warns_reruns_off_the_whole_range() -> None:
    result = _result(rerun=True)
    result.done_through = {0: 12}
    hint = resume_hint(result)
    assert "--partition 0 --from-offset 13; --partition 1 --from-offset 0" in hint
    assert "do not replay the whole range again with --rerun" in hint
    assert "also safe" in resume_hint(_result())


def test_the_pace_gives_no_credit_for_a_slow_start_or_a_stall() -> None:
    pace = Pace(10.0, now_s=0.0)
    # The first record comes 5 s late (a slow first fetch): it goes at once, and the
    # ones after it still go 0.1 s apart, not in a burst that makes up the 5 s.
    assert pace.wait_s(5.0) == 0.0
    waits = [pace.wait_s(5.0 + 0.1 * i) for i in range(3)]
    assert waits == pytest.approx([0.1, 0.1, 0.1])
    # Reading took longer than the slot: no wait, and no more than one record per slot.
    assert pace.wait_s(9.0) == 0.0
    assert pace.wait_s(9.0) == pytest.approx(0.1)


@given(st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=2, max_size=50))
def test_paced_records_are_never_closer_than_the_interval(gaps: list[float]) -> None:
    pace = Pace(20.0, now_s=0.0)
    now, sent = 0.0, []
    for gap in gaps:  # the time reading the next record took
        now += gap
        now += pace.wait_s(now)
        sent.append(now)
    assert all(b - a >= 0.05 - 1e-9 for a, b in pairwise(sent))
