"""The pure parts of `stats` and `job`: lag and age arithmetic, rates from worker reports,
liveness, and how a job's sightings become its status."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from stream_jobs.cli.stats import render_stats
from stream_jobs.failures import FailureInfo
from stream_jobs.kafka.scan import PartitionRange
from stream_jobs.lookup import JobLocation, Sighting, capped, judge, sighting_of
from stream_jobs.runtime.reports import WorkerReport
from stream_jobs.settings import Settings
from stream_jobs.tools.type_stats import (
    OutcomeCounts,
    PartitionLag,
    Rates,
    StatsSnapshot,
    TopicLag,
    TypeStats,
    age_s,
    alive_workers,
    backlog,
    rates_from_reports,
    unfinished_from,
    window_counts,
)

NOW = 1_700_000_000_000
PROPERTY = settings(max_examples=200, deadline=None)


def report(worker: str, at_s: float, *, started_s: float = -1000.0, final: bool = False,
           interval_s: float = 5.0, **outcomes: int) -> WorkerReport:
    """A report `at_s` seconds after NOW (negative: before)."""
    return WorkerReport(job_type="t", worker_id=worker, at_ms=NOW + int(at_s * 1000),
                        started_at_ms=NOW + int(started_s * 1000), outcomes=outcomes,
                        final=final, interval_s=interval_s)


# -- lag and age ----------------------------------------------------------------------------


def test_lag_counts_from_the_committed_offset() -> None:
    assert backlog(beginning=0, end=100, committed=40) == 60
    assert backlog(beginning=0, end=100, committed=100) == 0


def test_a_group_that_never_committed_counts_from_the_beginning() -> None:
    assert backlog(beginning=0, end=7, committed=None) == 7
    assert backlog(beginning=30, end=50, committed=None) == 20
    assert unfinished_from(beginning=30, committed=None) == 30


def test_records_deleted_by_retention_are_not_lag() -> None:
    assert backlog(beginning=500, end=600, committed=100) == 100
    assert unfinished_from(beginning=500, committed=100) == 500


@PROPERTY
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.none() | st.integers(0, 2 * 10**6))
def test_lag_is_never_negative_nor_more_than_held(beginning: int, size: int,
                                                  committed: int | None) -> None:
    end = beginning + size
    lag = backlog(beginning, end, committed)
    assert 0 <= lag <= size
    assert lag == max(0, end - unfinished_from(beginning, committed))


def test_age_is_seconds_and_never_negative() -> None:
    assert age_s(NOW, NOW - 1500) == 1.5
    assert age_s(NOW, NOW + 200) == 0.0  # a producer clock ahead of ours


# -- rates from reports ---------------------------------------------------------------------


def test_rate_is_the_latest_report_minus_the_one_at_the_window_start() -> None:
    reports = [
        report("w1", -70, succeeded=100),
        report("w1", -61, succeeded=150, retried=1),
        report("w1", -30, succeeded=300, retried=2),
        report("w1", -1, succeeded=450, retried=4, duplicate=10),
    ]
    counts = window_counts(reports, now_ms=NOW, window_s=60)
    assert counts == OutcomeCounts(done=450 + 10 - 150, retried=3)
    rates = rates_from_reports(reports, now_ms=NOW, window_s=60)
    assert rates.per_s()["done"] == pytest.approx(310 / 60)
    assert rates.per_s()["retried"] == pytest.approx(3 / 60)


def test_a_worker_started_inside_the_window_counts_from_zero() -> None:
    only = [report("w1", -2, started_s=-10, succeeded=40, dead_lettered=2, expired=1)]
    assert window_counts(only, now_ms=NOW, window_s=60) == OutcomeCounts(
        done=40, dead_lettered=2, expired=1)


def test_a_worker_started_before_the_window_with_one_report_counts_nothing_unknown() -> None:
    # Its counters include work from before the window; without an older report the
    # oldest one seen is the baseline, so nothing from before the window is counted.
    only = [report("w1", -2, started_s=-3600, succeeded=5000)]
    assert window_counts(only, now_ms=NOW, window_s=60) == OutcomeCounts()
    two = [report("w1", -50, started_s=-3600, succeeded=5000),
           report("w1", -2, started_s=-3600, succeeded=5100)]
    assert window_counts(two, now_ms=NOW, window_s=60) == OutcomeCounts(done=100)


def test_rates_sum_over_workers_and_ignore_quiet_ones() -> None:
    reports = [
        report("a", -65, succeeded=10), report("a", -5, succeeded=70),
        report("b", -8, started_s=-9, succeeded=5, expired=3),
        # Stopped long ago: its last report is before the window, so it adds nothing.
        report("c", -300, succeeded=1000), report("c", -200, succeeded=2000, final=True),
    ]
    assert window_counts(reports, now_ms=NOW, window_s=60) == OutcomeCounts(done=65, expired=3)


def test_reports_in_any_order_give_the_same_rates() -> None:
    reports = [report("a", -65, succeeded=10), report("a", -30, succeeded=40),
               report("a", -5, succeeded=70)]
    expected = window_counts(reports, now_ms=NOW, window_s=60)
    assert window_counts(list(reversed(reports)), now_ms=NOW, window_s=60) == expected


def test_no_reports_means_zero_rates() -> None:
    rates = rates_from_reports([], now_ms=NOW, window_s=60)
    assert rates.counts.total == 0
    assert set(rates.per_s().values()) == {0.0}


@PROPERTY
@given(st.lists(st.integers(0, 50), min_size=1, max_size=20), st.integers(1, 120))
def test_window_counts_never_exceed_the_latest_totals(steps: list[int], window: int) -> None:
    total, reports = 0, []
    for i, step in enumerate(steps):
        total += step
        reports.append(report("w", -len(steps) * 5 + i * 5, started_s=-len(steps) * 5 - 1,
                              succeeded=total))
    counts = window_counts(reports, now_ms=NOW, window_s=window)
    assert 0 <= counts.done <= total


# -- liveness -------------------------------------------------------------------------------


def test_alive_means_a_recent_report_that_was_not_final() -> None:
    reports = [
        report("fresh", -4), report("old", -16), report("stopped", -1, final=True),
        report("restarted", -40), report("restarted", -2),
    ]
    alive = alive_workers(reports, now_ms=NOW)
    assert [r.worker_id for r in alive] == ["fresh", "restarted"]
    # Workers that report every 0.2 s and have been silent for seconds are gone.
    quick = [replace(r, interval_s=0.2) for r in reports]
    assert [r.worker_id for r in alive_workers(quick, now_ms=NOW)] == []


# -- where is my job ------------------------------------------------------------------------


def seen(role: str, *, attempt: int = 1, at: int = 0, behind: bool = False,
         requeues: int = 0) -> Sighting:
    name = {"lane": "default", "tier": "5s", "dlq": "dlq"}[role]
    return Sighting(topic=f"p.t.{role}", role=role, name=name,  # type: ignore[arg-type]
                    partition=0, offset=at, timestamp_ms=NOW + at, attempt=attempt,
                    requeues=requeues, behind_commit=behind)


def test_no_sighting_is_not_seen() -> None:
    assert judge([]) == ("not_seen", None)


def test_a_job_waiting_in_its_lane_is_pending() -> None:
    assert judge([seen("lane")])[0] == "pending"


def test_a_job_its_worker_committed_past_is_finished() -> None:
    assert judge([seen("lane", behind=True)])[0] == "finished"


def test_the_latest_attempt_decides() -> None:
    history = [seen("lane", attempt=1, at=0, behind=True),
               seen("tier", attempt=2, at=10, behind=True),
               seen("lane", attempt=2, at=5010)]
    assert judge(history) == ("pending", history[2])
    waiting = [seen("lane", attempt=1, at=0, behind=True), seen("tier", attempt=2, at=10)]
    assert judge(waiting) == ("retrying", waiting[1])
    # Same attempt, same millisecond: the dead letter follows its lane record.
    dead = [seen("lane", attempt=4, at=20, behind=True), seen("dlq", attempt=4, at=20)]
    assert judge(dead) == ("dead_lettered", dead[1])


def test_a_requeued_dead_letter_is_pending_again() -> None:
    history = [seen("dlq", attempt=4, at=50), seen("lane", attempt=1, at=9000, requeues=1)]
    assert judge(history)[0] == "pending"


def test_a_tier_record_the_relay_released_counts_as_pending() -> None:
    assert judge([seen("tier", attempt=2, behind=True)])[0] == "pending"


def test_a_first_attempt_waiting_out_its_delay_is_scheduled_not_retrying() -> None:
    delayed = seen("tier", attempt=1)
    assert judge([delayed]) == ("scheduled", delayed)
    # The relay moved it to a shorter tier: still its delay, still scheduled.
    hopped = [seen("tier", attempt=1, at=0, behind=True), seen("tier", attempt=1, at=60_000)]
    assert judge(hopped) == ("scheduled", hopped[1])
    # A first attempt that failed waits in a tier for attempt 2, with its failure.
    failure = FailureInfo("exception", "ValueError", "boom", "", NOW)
    failed = [seen("lane", attempt=1, behind=True),
              replace(seen("tier", attempt=2, at=10), failure=failure)]
    assert judge(failed) == ("retrying", failed[1])
    location = JobLocation("j", "scheduled", "t", 1, last=replace(delayed, not_before_ms=NOW))
    assert location.summary().endswith("for its first attempt, due "
                                       "2023-11-14T22:13:20+00:00: it was enqueued with a delay.")


@dataclass
class FakeRecord:
    topic: str = "p.t.dlq"
    partition: int = 2
    offset: int = 9
    timestamp: int = NOW
    key: bytes | None = None
    value: bytes | None = b"{}"
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def test_a_sighting_reads_the_headers_and_tolerates_bad_ones() -> None:
    failure = FailureInfo("max-attempts", "ValueError", "boom", "", NOW)
    record = FakeRecord(headers=[("sj-job-id", b"j1"), ("sj-attempt", b"4"),
                                 ("sj-error", failure.to_json()), ("sj-requeues", b"x")])
    found = sighting_of(record, "j1", role="dlq", name="dlq", committed=None)
    assert found is not None
    assert (found.attempt, found.requeues, found.failure) == (4, 0, failure)
    assert (found.partition, found.offset, found.behind_commit) == (2, 9, False)
    assert sighting_of(record, "j2", role="dlq", name="dlq", committed=None) is None
    lane = FakeRecord(topic="p.t", headers=[("sj-job-id", b"j1")])
    found_lane = sighting_of(lane, "j1", role="lane", name="default", committed=10)
    assert found_lane is not None
    assert found_lane.behind_commit
    assert found_lane.attempt == 1


def test_the_scan_cap_is_shared_between_partitions() -> None:
    ranges = [PartitionRange(0, 0, 1000), PartitionRange(1, 50, 60)]
    cut, truncated = capped(ranges, 100)
    assert cut == [PartitionRange(0, 0, 50), PartitionRange(1, 50, 60)]
    assert truncated
    assert capped(ranges, 10_000) == (ranges, False)
    assert capped([], 5) == ([], False)


# -- the snapshot as JSON and as tables -----------------------------------------------------


def snapshot() -> StatsSnapshot:
    lane = TopicLag("default", "p.t", True, 7, 12.5, (
        PartitionLag(0, 0, 10, 5, 5, 12.5), PartitionLag(1, 0, 2, None, 2, 3.0)))
    tier = TopicLag("5s", "p.t.retry-5s", True, 3, None, (PartitionLag(0, 0, 3, None, 3),))
    stats = TypeStats("t", (lane,), (tier,), "p.t.dlq", 2,
                      Rates(60, OutcomeCounts(done=120, retried=6)),
                      (report("w1", -1),))
    return StatsSnapshot(NOW, "p", 60, (stats,))


def test_the_json_document_has_the_documented_shape() -> None:
    document = snapshot().to_dict(per_partition=True)
    typed = document["types"]["t"]
    assert (typed["lag"], typed["oldest_age_s"]) == (7, 12.5)
    assert typed["lanes"]["default"]["partitions"][1] == {
        "partition": 1, "beginning": 0, "end": 2, "committed": None, "lag": 2,
        "oldest_age_s": 3.0}
    assert typed["tiers"] == {"5s": {"topic": "p.t.retry-5s", "depth": 3, "partitions": [
        {"partition": 0, "beginning": 0, "end": 3, "committed": None, "depth": 3}]}}
    assert typed["dlq"] == {"topic": "p.t.dlq", "depth": 2}
    assert typed["rates"]["per_s"]["done"] == 2.0
    assert typed["rates"]["counts"]["retried"] == 6
    assert typed["workers"] == {"alive": 1, "in_flight": 0, "ids": ["w1"]}
    assert typed["missing_topics"] == []
    assert "partitions" not in snapshot().to_dict()["types"]["t"]["lanes"]["default"]


def test_the_tables_show_lag_age_depths_and_rates() -> None:
    console = Console(record=True, width=100)
    console.print(render_stats(snapshot(), Settings(), partitions=True))
    text = console.export_text()
    for expected in ("lane default", "12.5s", "tier 5s", "dlq", "2.00", "0.10", "p.t.retry-5s"):
        assert expected in text


# -- flow control in the snapshot -------------------------------------------------------------


def flow_snapshot() -> StatsSnapshot:
    from stream_jobs.runtime.heartbeats import heartbeat_stats
    from stream_jobs.runtime.throttle import RateInForce

    lane = TopicLag("default", "p.t", True, 9, 30.0, (
        PartitionLag(0, 0, 10, 1, 9, 30.0), PartitionLag(1, 0, 4, 4, 0, None)))
    worker = replace(report("w1", -1), rate_limit_per_s=50.0, rate_source="throttle",
                     rate_share_per_s=50.0, heartbeats=(("p.t", 1, NOW - 300),))
    stopped = replace(report("w2", -4), heartbeats=(("p.t", 0, NOW - 4000),))
    beats = heartbeat_stats(interval_s=0.5, lanes=[("p.t", 0, 9, 30.0), ("p.t", 1, 0, None)],
                            reported=[worker.heartbeats, stopped.heartbeats], now_ms=NOW)
    stats = TypeStats("t", (lane,), (), "p.t.dlq", 0, Rates(60), (worker,),
                      rate=RateInForce(50.0, "throttle"), heartbeats=beats)
    return StatsSnapshot(NOW, "p", 60, (stats,))


def test_the_json_document_has_the_limit_in_force_and_the_stuck_partitions() -> None:
    typed = flow_snapshot().to_dict(per_partition=True)["types"]["t"]
    assert typed["rate_limit"] == {"per_s": 50.0, "source": "throttle", "workers_applying": 1,
                                   "share_per_s": 50.0}
    assert typed["heartbeats"]["interval_s"] == 0.5
    assert typed["heartbeats"]["stuck_after_s"] == 1.0
    assert typed["heartbeats"]["stuck"] == [
        {"topic": "p.t", "partition": 0, "state": "stuck", "age_s": 4.0}]
    assert [p["state"] for p in typed["heartbeats"]["partitions"]] == ["stuck", "idle"]
    assert snapshot().to_dict()["types"]["t"]["heartbeats"] is None


def test_the_tables_show_the_limit_and_flag_stuck_partitions() -> None:
    console = Console(record=True, width=120)
    console.print(render_stats(flow_snapshot(), Settings(), partitions=True))
    text = console.export_text()
    assert "50/s throttle" in text
    assert "1 partition stuck" in text
    assert "p.t[0]" in text
    assert "stuck 4.0s" in text


def test_a_report_carries_the_rate_and_heartbeats_through_json() -> None:
    sent = replace(report("w1", -1, succeeded=3), rate_limit_per_s=50.0,
                   rate_source="throttle", rate_share_per_s=25.0,
                   heartbeats=(("p.t", 0, NOW - 5), ("p.t.high", 2, NOW - 9)))
    assert WorkerReport.from_json(sent.to_json()) == sent
    older = WorkerReport.from_json(b'{"job_type": "t", "worker_id": "w", "at_ms": 1, '
                                   b'"started_at_ms": 0}')
    assert older is not None
    assert (older.rate_limit_per_s, older.rate_source, older.heartbeats) == (None, "none", ())
    assert WorkerReport.from_json(b'{"job_type": "t", "worker_id": "w", "at_ms": 1, '
                                  b'"started_at_ms": 0, "heartbeats": [["p.t", "x"]]}') is None
