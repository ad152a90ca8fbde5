"""The fairness section of the bench (the noisy neighbour, issue 27): its figures from the
stamps, the most jobs of a tenant running at once, and its part of RESULTS.md. No
services."""

from __future__ import annotations

import pytest

from ops.bench.common import BenchError, Results
from ops.bench.fair_figures import most_running, most_running_by_tenant, noisy_run_figures
from ops.bench.fairness import NOT_RUN
from ops.bench.report import OWN_HEADINGS, render
from ops.bench.report.fairness import fairness_section


def test_dwell_completion_and_throughput_come_from_the_stamps() -> None:
    released = 100.0
    flood = [(0, 99.0, 100.0 + i / 100, 100.01 + i / 100) for i in range(100)]
    quiet = [(1 + i % 10, 100.0 + i / 10, 100.0 + i / 10 + 0.005, 100.01 + i / 10)
             for i in range(20)]
    found = noisy_run_figures([*flood, *quiet], released)
    assert found["quiet_p50_ms"] == pytest.approx(5.0)
    assert found["quiet_p99_ms"] == pytest.approx(5.0)
    assert found["flood_s"] == pytest.approx(1.0)
    # A's last job ends at 101.0: the 100 of A and the 10 quiet ones that ended by then.
    assert found["throughput"] == pytest.approx(110 / 1.0)
    assert found["jobs"] == 120


def test_a_run_without_a_quiet_or_a_noisy_job_is_no_figure() -> None:
    with pytest.raises(BenchError, match="0 quiet"):
        noisy_run_figures([(0, 1.0, 2.0, 3.0)], 1.5)
    with pytest.raises(BenchError, match="before the workers were released"):
        noisy_run_figures([(0, 1.0, 2.0, 3.0), (1, 1.0, 2.0, 3.0)], 5.0)


def test_most_running_counts_overlaps_not_touching_ends() -> None:
    assert most_running([]) == 0
    assert most_running([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]) == 1
    assert most_running([(0.0, 3.0), (1.0, 2.0), (1.5, 4.0), (3.5, 5.0)]) == 3
    stamps = [(1, 0.0, 0.0, 2.0), (1, 0.0, 1.0, 3.0), (2, 0.0, 0.0, 1.0), (2, 0.0, 1.0, 2.0)]
    assert most_running_by_tenant(stamps) == {1: 2, 2: 1}


def _arm(arm: str, p99: float, throughput: float) -> dict[str, object]:
    return {"arm": arm, "run": 1, "quiet_p50_ms": 5.0, "quiet_p99_ms": p99,
            "quiet_max_ms": p99 * 2, "flood_s": 3.0, "throughput": throughput,
            "load_avg_before": 1.5, "load_avg_after": 2.0}


def _results(limit: dict[str, object]) -> Results:
    results = Results()
    results.add("fairness.quiet_p99_on", "on", "ms", [120.0])
    results.add("fairness.quiet_p99_off", "off", "ms", [2_400.0])
    results.add("fairness.throughput_on", "on", "jobs/s", [9_500.0])
    results.add("fairness.throughput_off", "off", "jobs/s", [10_000.0])
    results.add("fairness.noop_now", "now", "jobs/s", [20_000.0, 21_000.0])
    results.add("fairness.noop_before", "before", "jobs/s", [20_500.0, 20_000.0])
    results.details["fairness"] = {
        "measured_at": "today", "took_s": 280.0, "nproc": 2, "load_avg_before": 1.2,
        "load_avg_after": 2.2, "load": {"flood": 50_000, "quiet_tenants": 10,
                                        "quiet_rate_per_s": 10.0, "quiet_s": 30.0,
                                        "hold_ms": 2, "processes": 2},
        "arms": [_arm("on", 120.0, 9_500.0), _arm("off", 2_400.0, 10_000.0)],
        "limit": limit}
    return results


def test_the_section_judges_each_goal_and_names_the_without_figure() -> None:
    results = _results({"run": False, "why": NOT_RUN})
    data = results.to_json()
    text = "\n".join(fairness_section(data["details"]["fairness"], data["figures"]))
    assert text.startswith("## Fair queues")
    assert ("| quiet tenants' dwell p99 with `[fairness]` <= 1 s (without: 2,400 ms) | "
            "120 ms |") in text
    assert "| the type's throughput with `[fairness]` >= 0.9x without | 0.95x |" in text
    assert f"| {NOT_RUN} |  | NOT RUN |" in text
    assert "| 1 | off | 5.00 ms | 2,400 ms | 4,800 ms | 3.00 s | 10,000 jobs/s | 1.5 - 2.0 |" \
        in text
    assert "fairness" in OWN_HEADINGS
    assert "## Fair queues" in render(data)


def test_the_tenant_limit_row_is_met_only_at_the_limit() -> None:
    def row(most: dict[str, int]) -> str:
        limit = {"run": True, "limit": 4, "most_running": most}
        data = _results(limit).to_json()
        lines = fairness_section(data["details"]["fairness"], data["figures"])
        return next(line for line in lines if "`tenant_concurrency`" in line)

    assert "| 4 of 4 | t0: 4, t1: 4 | **MET** |" in row({"t0": 4, "t1": 4})
    assert "**NOT MET** | over the limit by 1 |" in row({"t0": 5, "t1": 4})
    assert "was never reached" in row({"t0": 2, "t1": 3})
