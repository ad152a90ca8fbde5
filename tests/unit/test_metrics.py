"""Metrics, charts and the ops files that use them. No services.

The Grafana dashboard and the alert rules may name only series we export, and the
collectors must export exactly the names `stream_jobs.runtime.metrics` declares.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream_jobs.dlq.tally import DlqCounts
from stream_jobs.fairness.census import TenantCensus, WaitingCount, fold
from stream_jobs.fairness.tally import TOP_TENANTS, TenantDwell, section_of
from stream_jobs.gateway.charts import bar_chart, line_chart, nice_max
from stream_jobs.gateway.metrics import (
    EXPORTED_METRICS,
    GATEWAY_METRICS,
    HistoryCollector,
    StatsCollector,
)
from stream_jobs.histogram import DurationHistogram
from stream_jobs.history.tally import Tally
from stream_jobs.kafka import TopicPartition
from stream_jobs.offsets import OffsetTracker
from stream_jobs.outbox.depth import OutboxDepth
from stream_jobs.runtime.heartbeats import HeartbeatStats, PartitionBeat
from stream_jobs.runtime.metrics import WORKER_METRICS, WorkerCollector
from stream_jobs.runtime.reports import WorkerReport
from stream_jobs.runtime.throttle import RateInForce
from stream_jobs.tools.type_stats import (
    OutcomeCounts,
    PartitionLag,
    Rates,
    StatsSnapshot,
    TopicLag,
    TypeStats,
)

OPS = Path(__file__).resolve().parents[2] / "ops"
SERIES = re.compile(r"\bstream_jobs_[a-z0-9_]+")


def _exposed(registry: CollectorRegistry) -> set[str]:
    """Series names as Prometheus stores them (with _total, _bucket, _sum, _count)."""
    text = generate_latest(registry).decode()
    return {sample.name for family in text_string_to_metric_families(text)
            for sample in family.samples}


def _worker() -> Any:
    tp = TopicPartition("jobs.t", 0)
    tracker = OffsetTracker(0)
    for offset in range(5):
        tracker.dispatched(offset)
    tracker.finished(0)
    return SimpleNamespace(
        policy=SimpleNamespace(job_type="t"),
        outcomes=Counter({"succeeded": 3, "dead_lettered": 1}),
        dead_letter_reasons=Counter({"permanent": 1}), durations=None,
        in_flight=lambda: 2, rate=RateInForce(50.0, "toml"), rate_share_per_s=25.0,
        partitions={tp: SimpleNamespace(tracker=tracker, revoked=False)},
        consumer=SimpleNamespace(highwater=lambda _tp: 9), relay=SimpleNamespace(released=4),
        threads=SimpleNamespace(busy=3, overdue=1, overdue_total=2),
        loop_watch=SimpleNamespace(stalls=5))


def _snapshot() -> StatsSnapshot:
    lane = TopicLag("default", "jobs.t", True, 7, 12.5,
                    (PartitionLag(0, 0, 10, 3, 7, 12.5),))
    report = WorkerReport(job_type="t", worker_id="w", at_ms=1, started_at_ms=0, in_flight=2)
    beats = HeartbeatStats(1.0, (PartitionBeat("jobs.t", 0, None, None, "stuck"),))
    stats = TypeStats("t", (lane,), (TopicLag("5s", "jobs.t.retry-5s", True, 1, None),),
                      "jobs.t.dlq", 2, Rates(60.0, OutcomeCounts(done=60)), (report,),
                      rate=RateInForce(50.0, "throttle"), heartbeats=beats,
                      dlq=DlqCounts(letters=2, jobs=1))
    return StatsSnapshot(1_700_000_000_000, "jobs", 60.0, (stats,),
                         outbox=OutboxDepth("public", 12, 75.5, 0))


def test_worker_collector_exports_its_declared_names() -> None:
    worker = _worker()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    worker.durations.observe(0.002)  # registering turned the histogram on
    assert _exposed(registry) == WORKER_METRICS
    text = generate_latest(registry).decode()
    assert 'stream_jobs_jobs_total{outcome="succeeded",type="t"} 3.0' in text
    assert 'stream_jobs_jobs_total{outcome="expired",type="t"} 0.0' in text
    assert 'stream_jobs_worker_partition_lag{partition="0",topic="jobs.t",type="t"} 8.0' in text
    assert 'stream_jobs_handler_duration_seconds_bucket{le="0.0025",type="t"} 1.0' in text
    assert 'stream_jobs_worker_overdue_threads{type="t"} 1.0' in text
    assert 'stream_jobs_overdue_threads_total{type="t"} 2.0' in text
    assert 'stream_jobs_loop_stalls_total{type="t"} 5.0' in text


def test_stats_collector_exports_its_declared_names() -> None:
    registry = CollectorRegistry(auto_describe=False)
    snapshot: StatsSnapshot | None = None
    registry.register(StatsCollector(lambda: snapshot, lambda: {"t": _tenants(3)}))
    assert _exposed(registry) == set()  # nothing before the first sample
    snapshot = _snapshot()
    own = {"stream_jobs_gateway_enqueued_total", "stream_jobs_gateway_requests_total",
           "stream_jobs_history_jobs_total"}
    assert _exposed(registry) == GATEWAY_METRICS - own
    text = generate_latest(registry).decode()
    assert 'stream_jobs_partition_stuck{partition="0",topic="jobs.t",type="t"} 1.0' in text
    assert 'stream_jobs_outcomes_per_second{outcome="done",type="t"} 1.0' in text
    assert 'stream_jobs_outbox_oldest_age_seconds{schema="public"} 75.5' in text
    # Two letters of one job: the DLQ's depth counts letters, its jobs gauge the job.
    assert 'stream_jobs_dlq_depth{type="t"} 2.0' in text
    assert 'stream_jobs_dlq_jobs{type="t"} 1.0' in text


def _tenants(count: int) -> TenantCensus:
    dwell = TenantDwell()
    for n in range(count):
        dwell.observe(f"tenant-{n}", 0.2)
    return fold("t", WaitingCount({f"tenant-{n}": n + 1 for n in range(count)}, {}, 0, True),
                [section_of(dwell, [])], workers=1)


def test_tenant_gauges_name_at_most_the_top_tenants_and_other() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(_snapshot, lambda: {"t": _tenants(50)}))
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("stream_jobs_tenant_waiting", "stream_jobs_tenant_in_flight",
                 "stream_jobs_tenant_overflow", "stream_jobs_tenant_dwell_p95_seconds"):
        tenants = {s.labels["tenant"] for s in families[name].samples}
        assert len(tenants) <= TOP_TENANTS + 1, name
        assert "other" in tenants
    waiting = {s.labels["tenant"]: s.value for s in families["stream_jobs_tenant_waiting"].samples}
    assert sum(waiting.values()) == sum(range(1, 51))  # the rest summed, nothing lost
    assert waiting["tenant-49"] == 50
    assert len(waiting) == TOP_TENANTS + 1


def test_history_collector_counts_the_history_totals() -> None:
    """The history's running totals as a counter per type and outcome; nothing before the
    gateway first read them."""
    registry = CollectorRegistry(auto_describe=False)
    totals: dict[str, Tally] | None = None
    registry.register(HistoryCollector(lambda: totals))
    assert _exposed(registry) == set()
    totals = {"a.b": Tally({"succeeded": 400, "dead_lettered": 100}), "c": Tally()}
    assert _exposed(registry) == {"stream_jobs_history_jobs_total"}
    text = generate_latest(registry).decode()
    assert 'stream_jobs_history_jobs_total{outcome="succeeded",type="a.b"} 400.0' in text
    assert 'stream_jobs_history_jobs_total{outcome="dead_lettered",type="a.b"} 100.0' in text
    assert "# TYPE stream_jobs_history_jobs_total counter" in text


def _grafana_exprs() -> list[str]:
    board = json.loads((OPS / "grafana" / "stream-jobs.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    return exprs


def _alerts() -> list[dict[str, Any]]:
    rules = yaml.safe_load((OPS / "prometheus" / "alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("source", ["grafana", "alerts"])
def test_ops_files_use_only_exported_metrics(source: str) -> None:
    exprs = _grafana_exprs() if source == "grafana" else [r["expr"] for r in _alerts()]
    used = {name for expr in exprs for name in SERIES.findall(expr)}
    assert used, "no stream_jobs_* series found"
    assert used <= EXPORTED_METRICS, f"not exported: {sorted(used - EXPORTED_METRICS)}"


def test_alerts_cover_lag_age_dlq_and_stuck_partitions() -> None:
    config = yaml.safe_load((OPS / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    alerts = {rule["alert"]: rule for rule in _alerts()}
    for name in ("StreamJobsLagGrowing", "StreamJobsOldestJobTooOld", "StreamJobsDlqGrowing",
                 "StreamJobsPartitionStuck", "StreamJobsOutboxStuck"):
        assert name in alerts
        assert alerts[name]["labels"]["severity"] in {"warning", "critical"}
        assert alerts[name]["annotations"]["summary"]
    # The outbox's alert fires once its oldest row is older than a minute.
    outbox = alerts["StreamJobsOutboxStuck"]["expr"]
    assert outbox.endswith("(stream_jobs_outbox_oldest_age_seconds) > 60")


def test_duration_histogram_buckets_are_cumulative() -> None:
    hist = DurationHistogram((0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 3.0):
        hist.observe(seconds)
    assert hist.cumulative() == [(0.1, 2), (1.0, 3), (float("inf"), 4)]
    assert hist.count == 4
    assert hist.sum_s == pytest.approx(3.65)
    with pytest.raises(ValueError, match="increasing"):
        DurationHistogram((1.0, 0.5))


def test_charts_are_plain_svg() -> None:
    assert [nice_max(v) for v in (0, 0.3, 1, 7, 12, 4500)] == [1, 0.5, 1, 10, 20, 5000]
    end = 3_600_000
    svg = line_chart([(0, 1.0), (1_800_000, None), (3_000_000, 4.0), (3_600_000, 2.0)],
                     title="done <b>", unit="/s", end_ms=end)
    assert svg.startswith("<svg")
    assert "<script" not in svg
    assert "done &lt;b&gt;" in svg  # titles are escaped
    assert svg.count("<polyline") == 1
    assert svg.count("<circle") == 1
    assert "2 /s" in svg  # the latest value is in the title line
    bars = bar_chart([("permanent", 3), ("<x>", 1)], title="reasons")
    assert bars.count("<rect") == 2
    assert "&lt;x&gt;" in bars


def test_serve_refuses_to_start_without_a_token(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from stream_jobs.cli import main

    monkeypatch.delenv("STREAM_JOBS_GATEWAY_TOKEN", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--port", "1"])
    assert exited.value.code == 1
    assert "STREAM_JOBS_GATEWAY_TOKEN" in capsys.readouterr().err
