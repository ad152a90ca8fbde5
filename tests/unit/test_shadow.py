"""The pure parts of shadow mode: its group name, its reports, and the comparison `stats`
shows next to the real workers."""

from __future__ import annotations

from rich.console import Console

from stream_jobs.cli.stats import render_stats
from stream_jobs.naming import shadow_group
from stream_jobs.outcomes import Outcome, Reason
from stream_jobs.runtime.reports import LaneSeen, ShadowReport, WorkerReport
from stream_jobs.runtime.shadow import shadow_stats, shadow_window
from stream_jobs.settings import Settings
from stream_jobs.tools.type_stats import OutcomeCounts, Rates, StatsSnapshot, TopicLag, TypeStats

NOW = 1_700_000_000_000


def shadow(worker: str, at_s: float, *, started_s: float = -1000.0, final: bool = False,
           valid: int = 0, bad: int = 0) -> ShadowReport:
    return ShadowReport(job_type="t", worker_id=worker, at_ms=NOW + int(at_s * 1000),
                        started_at_ms=NOW + int(started_s * 1000),
                        lanes={"default": {0: LaneSeen(valid, bad)}},
                        undecodable_reasons={"bad-json": bad} if bad else {}, final=final)


def test_the_shadow_group_is_its_own() -> None:
    assert shadow_group("jobs", "email.send") == "jobs.email.send.shadow"


def test_shadow_reports_round_trip_and_are_not_worker_reports() -> None:
    report = ShadowReport("t", "s1", NOW, NOW - 5, {"high": {0: LaneSeen(3, 1), 2: LaneSeen(4)}},
                          {"bad-json": 1}, final=True, interval_s=2.0)
    raw = report.to_json()
    assert ShadowReport.from_json(raw) == report
    assert (report.valid, report.undecodable) == (7, 1)
    assert WorkerReport.from_json(raw) is None  # stats never counts a shadow as a worker
    worker = WorkerReport("t", "w1", NOW, NOW, {"succeeded": 1})
    assert ShadowReport.from_json(worker.to_json()) is None
    for junk in (b"", b"[]", b"{}", b'{"shadow": true}', b'{"shadow": true, "lanes": 3}'):
        assert ShadowReport.from_json(junk) is None
        assert WorkerReport.from_json(junk) is None


def test_the_window_counts_each_shadow_from_its_baseline() -> None:
    reports = [
        shadow("a", -90, valid=100), shadow("a", -61, valid=150, bad=1),
        shadow("a", -1, valid=190, bad=3),                      # 40 + 2 in the window
        shadow("b", -30, started_s=-40, valid=7),               # started inside: all 7
        shadow("c", -30, started_s=-500, valid=50), shadow("c", -5, valid=55),  # 5
    ]
    assert shadow_window(reports, now_ms=NOW, window_s=60) == (40 + 2 + 7 + 5, 2)


def test_the_comparison_sums_the_latest_reports_and_knows_who_is_alive() -> None:
    reports = [shadow("a", -20, started_s=-25, valid=10),
               shadow("a", -2, started_s=-25, valid=12, bad=1),
               shadow("b", -3, started_s=-25, valid=5, final=True)]
    stats = shadow_stats("p.t.shadow", {"default": ("p.t", 4), "high": ("p.t.high", 0)},
                         reports, worker_processed=17, now_ms=NOW, window_s=60)
    assert stats.lag == 4
    assert stats.shadows == ("a",)
    assert {lane.name: (lane.valid, lane.undecodable) for lane in stats.lanes} == {
        "default": (17, 1), "high": (0, 0)}
    assert stats.to_dict()["window"] == {"seen": 18, "undecodable": 1, "worker_processed": 17}
    assert stats.undecodable_reasons == {"bad-json": 1}


def test_stats_show_the_shadow_next_to_the_workers() -> None:
    lane = TopicLag("default", "p.t", True, 7, 1.0)
    compared = shadow_stats("p.t.shadow", {"default": ("p.t", 2)}, [shadow("a", -1, valid=9)],
                            worker_processed=8, now_ms=NOW, window_s=60)
    typed = TypeStats("t", (lane,), (), "p.t.dlq", 0, Rates(60, OutcomeCounts(done=8)), (),
                      shadow=compared)
    bare = TypeStats("u", (lane,), (), "p.u.dlq", 0, Rates(60), ())
    shot = StatsSnapshot(NOW, "p", 60, (typed, bare))
    document = shot.to_dict()
    assert document["types"]["t"]["shadow"]["lag"] == 2
    assert document["types"]["u"]["shadow"] is None
    console = Console(record=True, width=120)
    console.print(render_stats(shot, Settings(), partitions=False))
    text = console.export_text()
    assert "shadow vs worker" in text
    assert "shadow read" in text


def test_reports_counted_by_reason_and_outcome_codes_serialise() -> None:
    # Counters are keyed by the StrEnums of stream_jobs.outcomes; JSON keys must be text.
    shadow = ShadowReport("t", "s1", NOW, NOW - 5, {}, {Reason.BAD_JSON: 2})
    assert ShadowReport.from_json(shadow.to_json()) == ShadowReport(
        "t", "s1", NOW, NOW - 5, {}, {"bad-json": 2})
    worker = WorkerReport("t", "w1", NOW, NOW, {Outcome.SUCCEEDED: 1},
                          dead_letter_reasons={Reason.TIMEOUT: 3})
    back = WorkerReport.from_json(worker.to_json())
    assert back is not None
    assert (back.outcomes, back.dead_letter_reasons) == ({"succeeded": 1}, {"timeout": 3})
