"""The share-groups section of the bench (issue 29, point 5): the figures of a drain by
share consumers and of a kill, the broker's feature level, the bounded handler runs and
its part of RESULTS.md. No services."""

from __future__ import annotations

import asyncio

import pytest

from ops.bench.common import BenchError, Results
from ops.bench.report import OWN_HEADINGS, render
from ops.bench.report.share_groups import share_section
from ops.bench.share_groups import (
    ConsumerReport,
    _bounded,
    drain_figures,
    drain_figures_of,
    finalized_level,
    redelivery_figures,
)

DESCRIBE = """\
Feature: metadata.version    SupportedMinVersion: 3.3-IV3    SupportedMaxVersion: 4.4-IV2    \
FinalizedVersionLevel: 4.4-IV2    Epoch: 9
Feature: share.version       SupportedMinVersion: 0    SupportedMaxVersion: 2    \
FinalizedVersionLevel: 2    Epoch: 9
Feature: streams.version     SupportedMinVersion: 0    SupportedMaxVersion: 1    \
FinalizedVersionLevel: 1    Epoch: 9
"""


def _report(started: float, first: float, last: float, positions: list[tuple[int, int]],
            **more: object) -> ConsumerReport:
    counts = more.pop("delivery_counts", {1: len(positions)})
    return ConsumerReport(started=started, first=first, last=last, positions=positions,
                          delivery_counts=counts, **more)  # type: ignore[arg-type]


def test_a_drain_runs_from_the_first_handler_end_of_any_consumer_to_the_last() -> None:
    a = _report(10.0, 15.0, 16.0, [(0, i) for i in range(60)], max_batch=30)
    b = _report(10.5, 15.5, 17.0, [(1, i) for i in range(41)], max_batch=41)
    found = drain_figures([a, b], 101)
    assert found["rate"] == pytest.approx(100 / 2.0)
    assert found["start_to_last_rate"] == pytest.approx(101 / 7.0)
    assert found["join_s"] == pytest.approx(5.0)
    assert found["per_consumer"] == [60, 41]
    assert found["max_batch"] == 41
    assert found["redelivered"] == 0


def test_a_consumer_that_got_nothing_is_counted_not_timed() -> None:
    busy = _report(1.0, 6.0, 7.0, [(0, i) for i in range(10)])
    idle = ConsumerReport(started=0.5, first=None, last=None, positions=[],
                          delivery_counts={})
    found = drain_figures([busy, idle], 10)
    assert found["per_consumer"] == [10, 0]
    assert found["join_s"] == pytest.approx(5.5)


def test_a_lost_duplicated_or_foreign_record_is_no_figure() -> None:
    with pytest.raises(BenchError, match="9 records"):
        drain_figures([_report(0.0, 1.0, 2.0, [(0, i) for i in range(9)])], 10)
    with pytest.raises(BenchError, match="9 distinct"):
        drain_figures([_report(0.0, 1.0, 2.0, [(0, i) for i in range(9)]),
                       _report(0.0, 1.0, 2.0, [(0, 0)])], 10)
    with pytest.raises(BenchError, match="not our jobs"):
        drain_figures([_report(0.0, 1.0, 2.0, [(0, 0), (0, 1)], bad=1)], 2)


def test_redelivery_is_timed_from_the_kill() -> None:
    witness = _report(0.0, 5.0, 60.0, [(0, i) for i in range(10)],
                      delivery_counts={1: 6, 2: 4}, redelivered_at=50.5)
    found = redelivery_figures(witness, killed_at=50.0, acquired=4, n=10)
    assert found["kill_to_first_s"] == pytest.approx(0.5)
    assert found["kill_to_last_s"] == pytest.approx(10.0)
    assert found["delivered_again"] == 4
    assert found["delivery_counts"] == {"1": 6, "2": 4}
    with pytest.raises(BenchError, match="came back"):
        redelivery_figures(_report(0.0, 1.0, 2.0, [(0, 0)]), 1.5, 1, 1)
    with pytest.raises(BenchError, match="9 records of 10"):
        redelivery_figures(_report(0.0, 1.0, 2.0, [(0, i) for i in range(9)],
                                   redelivered_at=1.5), 1.0, 1, 10)


def test_the_report_survives_json() -> None:
    report = _report(1.0, 2.0, 3.0, [(0, 1), (1, 2)], delivery_counts={1: 1, 2: 1},
                     redelivered_at=2.5, max_batch=2)
    data = {"started": 1.0, "first": 2.0, "last": 3.0, "positions": [[0, 1], [1, 2]],
            "delivery_counts": {"1": 1, "2": 1}, "redelivered_at": 2.5, "bad": 0,
            "max_batch": 2}
    assert ConsumerReport.from_json(data) == report


def test_the_finalized_level_is_read_per_feature() -> None:
    assert finalized_level(DESCRIBE, "share.version") == 2
    assert finalized_level(DESCRIBE, "streams.version") == 1
    assert finalized_level(DESCRIBE, "share") is None
    assert finalized_level(DESCRIBE, "transaction.version") is None


def test_a_batch_runs_each_record_once_and_never_more_than_the_concurrency() -> None:
    running, most, seen = 0, 0, []

    async def run_one(record: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)
        seen.append(record)
        running -= 1

    for concurrency, expected in ((1, 1), (4, 4), (64, 10)):
        running, most, seen = 0, 0, []
        asyncio.run(_bounded(list(range(10)), run_one, concurrency))  # type: ignore[arg-type]
        assert sorted(seen) == list(range(10))
        assert most == expected


def _run(handler: str, name: str, consumers: int, concurrency: int, rate: float,
         ) -> dict[str, object]:
    run: dict[str, object] = {
        "handler": handler, "name": name, "run": 1, "n": 1000, "consumers": consumers,
        "concurrency": concurrency, "sleep_ms": 0 if handler == "noop" else 2, "rate": rate,
        "start_to_last_rate": rate / 10, "join_s": 5.0 if consumers > 0 else 0.3,
        "broker_cpu_s": 0.5, "broker_us_per_job": 40.0, "broker_background": 0.02,
        "load_avg_after": 1.5}
    if name.startswith("s"):
        run |= {"per_consumer": [250] * consumers, "max_batch": 500}
    return run


def _results() -> Results:
    results = Results()
    runs = [_run("noop", "s1", 1, 64, 60_000.0), _run("noop", "s4", 4, 64, 80_000.0),
            _run("noop", "group", 0, 64, 30_000.0), _run("io", "s1", 1, 1, 450.0),
            _run("io", "s4", 4, 1, 1_700.0), _run("io", "group_c1", 0, 1, 450.0),
            _run("io", "group_c64", 0, 64, 8_000.0)]
    drain_figures_of(results, runs)  # type: ignore[arg-type]
    results.details["share"] = {
        "measured_at": "today", "took_s": 200.0, "nproc": 2, "load_avg_before": 1.0,
        "load_avg_after": 1.4, "quick": False, "share_version": 2, "partitions": 2,
        "sleep_ms": 2, "client": "confluent-kafka 2.16.2", "backlogs": {"noop": 1000,
                                                                        "io": 1000},
        "runs": runs,
        "redeliver": {"acquired": 503, "before_kill": 497, "kill_to_first_s": 45.1,
                      "kill_to_last_s": 45.2, "delivery_counts": {"1": 497, "2": 503},
                      "group_configs": {"share.record.lock.duration.ms": "15000",
                                        "share.session.timeout.ms": "45000"}},
        "redeliver1": {"failed": "the victim acquired nothing", "partitions": 1}}
    return results


def test_the_figures_are_named_share_and_ref_group() -> None:
    names = set(_results().figures)
    assert {"share.noop_s1", "share.noop_s4", "share.ref_group_noop", "share.io_s1",
            "share.io_s4", "share.ref_group_io_c1", "share.ref_group_io_c64",
            "share.noop_s1_start", "share.ref_group_noop_start", "share.join_s4",
            "share.ref_group_join", "share.broker_us_noop_s1",
            "share.ref_group_broker_us_noop"} <= names
    assert all(name.startswith("share.") for name in names)


def test_the_section_shows_the_drains_ratios_and_the_kill() -> None:
    data = _results().to_json()
    text = "\n".join(share_section(data["details"]["share"], data["figures"]))
    assert text.startswith("## Kafka share groups")
    assert "`share.version` is finalized at 2" in text
    assert "| 1 | no-op | share x4, concurrency 64 | 80,000 jobs/s | 8,000 jobs/s | 5.00 s | " \
        "250 / 250 / 250 / 250 | 500 | 0.50 s | 40.0 us | 0.02 cores | 1.5 |" in text
    assert "| no-op drain: share x1 (job path only) / our worker | 2.00x |" in text
    assert "| 2 ms jobs one at a time: share x4 / share x1 | 3.78x |" in text
    assert "| 2 partitions, 2 consumers | 503 | 497 | 45.10 s | 45.20 s | 497 x 1, 503 x 2 |" \
        in text
    assert "| 1 partition, 2 consumers |  |  | failed: the victim acquired nothing |" in text
    assert "`share.record.lock.duration.ms=15000`" in text
    assert OWN_HEADINGS["share"] == "Kafka share groups"
    assert "## Kafka share groups" in render(data)
