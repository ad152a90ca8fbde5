"""Heartbeat records and when a partition counts as stuck."""

from __future__ import annotations

from typing import Any

import pytest

from stream_jobs.runtime.heartbeats import (
    HEADER_HEARTBEAT,
    HEARTBEAT_KEY,
    beat_state,
    is_heartbeat,
    newest_beats,
    report_interval_s,
)


def test_a_heartbeat_needs_its_key_and_its_header() -> None:
    assert is_heartbeat(HEARTBEAT_KEY, [(HEADER_HEARTBEAT, b"w1")])
    assert not is_heartbeat(HEARTBEAT_KEY, [("sj-job-id", b"1")])  # a user's key, a job
    assert not is_heartbeat(b"user-42", [(HEADER_HEARTBEAT, b"w1")])
    assert not is_heartbeat(None, [])


@pytest.mark.parametrize("headers", [None, "sj-heartbeat", [("sj-heartbeat",)], [b"sj-heartbeat"],
                                     [("sj-heartbeat", b"w1", b"extra")], ["sj"]])
def test_a_heartbeat_key_with_garbled_headers_is_a_record_to_decode_not_an_error(
        headers: Any) -> None:
    # The worker asks this of records that failed to decode; raising here escaped the
    # worker's job path (found by the fuzz test).
    assert not is_heartbeat(HEARTBEAT_KEY, headers)


def test_late_is_more_than_two_intervals() -> None:
    now = 100_000
    assert beat_state(now_ms=now, last_ms=now - 900, interval_s=0.5, lag=0) == "idle"
    assert beat_state(now_ms=now, last_ms=now - 1000, interval_s=0.5, lag=3) == "busy"
    # Only a fresh heartbeat waits: still idle.
    assert beat_state(now_ms=now, last_ms=now - 400, interval_s=0.5, lag=1,
                      oldest_age_s=0.9) == "idle"
    assert beat_state(now_ms=now, last_ms=now - 400, interval_s=0.5, lag=9,
                      oldest_age_s=3.0) == "busy"
    assert beat_state(now_ms=now, last_ms=now - 1001, interval_s=0.5, lag=0) == "stuck"
    assert beat_state(now_ms=now, last_ms=None, interval_s=0.5, lag=0) == "unknown"
    assert beat_state(now_ms=now, last_ms=None, interval_s=0.5, lag=1) == "stuck"


def test_the_newest_heartbeat_over_all_reports_counts() -> None:
    newest = newest_beats([
        [("jobs.a", 0, 100), ("jobs.a", 1, 50)],
        [("jobs.a", 0, 90), ("jobs.a.high", 0, 70)],
    ])
    assert newest == {("jobs.a", 0): 100, ("jobs.a", 1): 50, ("jobs.a.high", 0): 70}


def test_workers_report_four_times_per_interval_while_heartbeats_are_on() -> None:
    assert report_interval_s(5.0, None) == 5.0
    assert report_interval_s(5.0, 2.0) == 0.5
    assert report_interval_s(0.25, 60.0) == 0.25
