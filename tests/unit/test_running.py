"""What runs now (issue 26): the report's running jobs and process fields, parsed and
round-tripped; the running jobs read from a worker's runners; the live workers' view; a
pending job that a live worker's report lists shown as running. Pure: no services."""

from __future__ import annotations

import math

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.context import JobContext
from stream_jobs.dedup.store import DedupStore
from stream_jobs.lookup import JobLocation, Sighting
from stream_jobs.record import JobRecord
from stream_jobs.runtime.dispatch import Runner
from stream_jobs.runtime.reports import RUNNING_SHOWN, RunningJob, WorkerReport
from stream_jobs.runtime.running_jobs import in_handlers, process_fields
from stream_jobs.settings import Settings
from stream_jobs.tools.job_status import running_location
from stream_jobs.tools.running import running_view

NOW = 1_700_000_000_000
PROPERTY = settings(max_examples=200, deadline=None)

texts = st.text(min_size=1, max_size=20)
running_jobs = st.builds(RunningJob, job_id=texts, attempt=st.integers(1, 100), topic=texts,
                         partition=st.integers(0, 1000), offset=st.integers(0, 2**62),
                         started_at_ms=st.integers(0, 2**45))
reports = st.builds(
    WorkerReport, job_type=texts, worker_id=texts, at_ms=st.integers(0, 2**45),
    started_at_ms=st.integers(0, 2**45), in_flight=st.integers(0, 10**6),
    final=st.booleans(), interval_s=st.floats(0.1, 60), host=st.text(max_size=30),
    pid=st.integers(0, 2**22), version=st.text(max_size=10),
    partitions=st.lists(st.tuples(texts, st.integers(0, 1000)), max_size=5).map(tuple),
    running=st.lists(running_jobs, max_size=5).map(tuple), running_count=st.integers(0, 10**6))


@PROPERTY
@given(reports)
def test_a_report_round_trips_through_json(report: WorkerReport) -> None:
    assert WorkerReport.from_json(report.to_json()) == report


def test_a_report_from_before_these_fields_parses_with_defaults() -> None:
    old = orjson.dumps({"job_type": "t", "worker_id": "w", "at_ms": NOW, "started_at_ms": 0,
                        "outcomes": {"succeeded": 3}, "in_flight": 2})
    report = WorkerReport.from_json(old)
    assert report is not None
    assert (report.host, report.pid, report.version) == ("", 0, "")
    assert (report.partitions, report.running, report.running_count) == ((), (), 0)


def test_a_report_with_a_bad_running_list_is_not_a_report() -> None:
    base = {"job_type": "t", "worker_id": "w", "at_ms": NOW, "started_at_ms": 0}
    for running in ([{"job_id": "j"}], "jobs", [1, 2], None):
        assert WorkerReport.from_json(orjson.dumps({**base, "running": running})) is None


def _ctx(job_id: str, *, partition: int, offset: int, attempt: int = 1) -> JobContext:
    job = JobRecord(job_id=job_id, job_type="t", payload=b"{}", key=None, attempt=attempt)
    return JobContext(job, topic="jobs.t", partition=partition, offset=offset,
                      dedup=DedupStore(Settings()))


def _runner(ctx: JobContext | None, started_s: float, timeout_s: float = 60.0) -> Runner:
    """A runner in a handler call that started at `started_s` on the loop's clock."""
    runner = Runner()
    runner.ctx = ctx
    if ctx is not None:
        runner.deadline = started_s + timeout_s
    return runner


@PROPERTY
@given(st.lists(st.integers(0, 10**6), max_size=80), st.integers(1, 60))
def test_the_report_lists_the_oldest_runs_first(starts_ms: list[int], cap: int) -> None:
    loop_now_s, timeout_s = 2000.0, 60.0
    runners = [_runner(_ctx(f"j{i}", partition=i % 3, offset=i), started_s=1000 + ms / 1000,
                       timeout_s=timeout_s) for i, ms in enumerate(starts_ms)]
    runners.append(_runner(None, 0))  # a runner between records
    shown, count = in_handlers(runners, timeout_s=timeout_s, now_ms=NOW,
                               loop_now_s=loop_now_s, cap=cap)
    assert count == len(starts_ms)
    assert len(shown) == min(cap, len(starts_ms))
    # Loop second 1000 is wall-clock NOW - 1000 s.
    assert [job.started_at_ms for job in shown] == [NOW - 1_000_000 + ms
                                                    for ms in sorted(starts_ms)[:cap]]
    for job in shown:
        i = int(job.job_id[1:])
        assert (job.topic, job.partition, job.offset) == ("jobs.t", i % 3, i)


def test_a_run_leaves_the_report_when_its_call_ends() -> None:
    runner = _runner(_ctx("a", partition=0, offset=5, attempt=2), started_s=99.5)
    shown, count = in_handlers([runner], timeout_s=60.0, now_ms=NOW, loop_now_s=100.0)
    assert (shown, count) == ((RunningJob("a", 2, "jobs.t", 0, 5, NOW - 500),), 1)
    runner.ctx, runner.deadline = None, math.inf  # what the caller does once it returns
    assert in_handlers([runner], timeout_s=60.0, now_ms=NOW, loop_now_s=100.0) == ((), 0)
    assert RUNNING_SHOWN == 50


def test_the_process_fields_name_this_process() -> None:
    fields = process_fields()
    assert fields["host"]
    assert fields["pid"] > 0
    assert fields["version"]


def _report(worker: str, job_type: str = "t", *, at_s: float = -1, final: bool = False,
            host: str = "h1", pid: int = 10, running: tuple[RunningJob, ...] = (),
            count: int | None = None) -> WorkerReport:
    return WorkerReport(job_type=job_type, worker_id=worker, at_ms=NOW + int(at_s * 1000),
                        started_at_ms=NOW - 100_000, final=final, interval_s=5.0, host=host,
                        pid=pid, version="0.1.0", partitions=((f"jobs.{job_type}", 0),),
                        running=running,
                        running_count=len(running) if count is None else count, in_flight=3)


def _running(job_id: str, started_s_ago: float) -> RunningJob:
    return RunningJob(job_id, 1, "jobs.t", 0, 7, NOW - int(started_s_ago * 1000))


def test_the_view_keeps_live_workers_latest_reports_only() -> None:
    view = running_view([
        _report("old", at_s=-16),  # more than three 5 s intervals ago: gone
        _report("stopped", final=True),  # its final report: stopped
        _report("w1", at_s=-9, running=(_running("stale", 30),)),
        _report("w1", at_s=-2, running=(_running("a", 3),)),  # w1's latest
    ], now_ms=NOW)
    assert [r.worker_id for r in view.workers] == ["w1"]
    assert [row.job.job_id for row in view.jobs] == ["a"]
    assert view.find("stale") is None
    assert view.report_age_s() == (2.0, 2.0)


def test_running_jobs_are_longest_first_across_workers_and_typed() -> None:
    view = running_view([
        _report("w1", running=(_running("b", 5), _running("c", 1))),
        _report("w2", "u", host="h2", running=(_running("a", 60),), count=51),
    ], now_ms=NOW)
    assert [(row.job.job_id, row.job_type) for row in view.jobs] == [
        ("a", "u"), ("b", "t"), ("c", "t")]
    assert view.jobs[0].running_for_s(NOW) == 60.0
    assert (view.running_count, view.unlisted) == (53, 50)
    only_t = running_view(view.workers, now_ms=NOW, job_type="t")
    assert [row.job.job_id for row in only_t.jobs] == ["b", "c"]


def test_a_process_running_several_types_is_one_row() -> None:
    view = running_view([
        _report("w1", "t", running=(_running("b", 5),)),
        _report("w2", "u", running=(_running("a", 9),)),
        _report("w3", "t", host="h2", pid=11),
        _report("legacy", "t", host="", pid=0),
    ], now_ms=NOW)
    rows = {p.key: p for p in view.processes}
    assert sorted(rows) == ["h1:10", "h2:11", "legacy"]
    both = rows["h1:10"]
    assert both.types == ("t", "u")
    assert both.partitions == (("jobs.t", 0), ("jobs.u", 0))
    assert (both.in_flight, both.running_count) == (6, 2)
    assert both.oldest is not None
    assert both.oldest.job.job_id == "a"
    assert rows["h2:11"].oldest is None
    assert rows["h1:10"].report_age_s(NOW) == 1.0
    document = view.to_dict()
    assert document["live_workers"] == 4
    assert len(document["workers"]) == 3
    assert orjson.loads(orjson.dumps(document)) == document


def test_no_live_worker_is_an_empty_view() -> None:
    view = running_view([_report("w1", at_s=-60)], now_ms=NOW)
    assert (view.workers, view.jobs, view.processes) == ((), [], [])
    assert view.report_age_s() is None


def _pending(job_id: str) -> JobLocation:
    seen = Sighting("jobs.t", "lane", "default", 0, 7, NOW - 10_000, attempt=1)
    return JobLocation(job_id, "pending", "t", 1, None, seen, (seen,))


def test_a_pending_job_a_live_worker_runs_is_running() -> None:
    view = running_view([_report("w1", running=(
        RunningJob("j1", 2, "jobs.t", 0, 7, NOW - 12_000),))], now_ms=NOW)
    found = running_location(_pending("j1"), view)
    assert found.status == "running"
    assert found.summary() == ("Job j1 (t) is running on w1 for 12 s (attempt 2, jobs.t "
                               "partition 0 offset 7).")
    assert found.to_dict()["running_on"]["worker_id"] == "w1"
    assert found.attempt == 2
    assert running_location(_pending("j2"), view).status == "pending"
