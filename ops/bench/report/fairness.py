"""`## Fair queues` in RESULTS.md: the noisy neighbour with `[fairness]` on and off, the
per-tenant concurrency limit and the no-op path without `[fairness]`
(ops/bench/fairness.py), each goal with the load the box had. Pure:
`fairness_section(details, figures) -> lines`."""

from __future__ import annotations

from typing import Any

from ops.bench import fairness as fairness_bench
from ops.bench.report.tables import (
    RATIO_COLUMNS,
    FigureJSON,
    figures_table,
    fmt,
    goal_rows,
    goals_of,
    ratio_rows,
    table,
)

GOAL_COLUMNS = ["goal", "measured (median)", "spread", "status", "by how much",
                "runs meeting it"]
ARM_COLUMNS = ["run", "[fairness]", "quiet dwell p50", "quiet dwell p99", "quiet dwell max",
               "A's completion", "throughput", "load avg before - after"]
RATIOS = [
    ("quiet dwell p99: with / without [fairness]", "fairness.quiet_p99_on",
     "fairness.quiet_p99_off"),
    ("A's completion: with / without [fairness]", "fairness.flood_s_on", "fairness.flood_s_off"),
    ("throughput: with / without [fairness]", "fairness.throughput_on",
     "fairness.throughput_off"),
    ("no-op: this code / before issue 27", "fairness.noop_now", "fairness.noop_before"),
]


def _goal_lines(details: dict[str, Any], figures: dict[str, FigureJSON]) -> list[list[str]]:
    rows = goal_rows(figures, goals_of(fairness_bench.GOALS))
    if rows and "fairness.quiet_p99_off" in figures:
        without = figures["fairness.quiet_p99_off"]["median"]
        rows[0][0] += f" (without: {fmt(without)} ms)"
    limit = details.get("limit", {"run": False, "why": fairness_bench.NOT_RUN})
    if not limit["run"]:
        rows.append([fairness_bench.LIMIT_GOAL, limit["why"], "", "NOT RUN", "", ""])
        return rows
    most = max(limit["most_running"].values())
    cap = limit["limit"]
    status = "**MET**" if most == cap else "**NOT MET**"
    how = ("the limit, reached and never passed" if most == cap else
           f"over the limit by {most - cap}" if most > cap else
           f"the limit ({cap}) was never reached: nothing was tested")
    rows.append([fairness_bench.LIMIT_GOAL, f"{most} of {cap}",
                 ", ".join(f"{t}: {n}" for t, n in limit["most_running"].items()),
                 status, how, "1/1" if most == cap else "0/1"])
    return rows


def _arm_rows(details: dict[str, Any]) -> list[list[str]]:
    return [[str(arm.get("run", 1)), arm["arm"], f"{fmt(arm['quiet_p50_ms'])} ms",
             f"{fmt(arm['quiet_p99_ms'])} ms", f"{fmt(arm['quiet_max_ms'])} ms",
             f"{fmt(arm['flood_s'])} s", f"{fmt(arm['throughput'])} jobs/s",
             f"{arm['load_avg_before']:.1f} - {arm['load_avg_after']:.1f}"]
            for arm in details.get("arms", [])]


def fairness_section(details: dict[str, Any], figures: dict[str, FigureJSON],
                     error: str | None = None) -> list[str]:
    """`## Fair queues`: the goals, the two arms with their load, ratios and figures."""
    quick = " (BENCH_QUICK smoke run: not for quoting)" if details.get("quick") else ""
    load = details.get("load", {})
    out = [f"## {fairness_bench.HEADING}", ""]
    out.append(
        f"Measured on {details.get('measured_at')}{quick} in "
        f"{details.get('took_s', 0) / 60:.1f} min on {details.get('nproc')} cores; the "
        f"1-minute load average went from {details.get('load_avg_before', 0):.1f} to "
        f"{details.get('load_avg_after', 0):.1f}. Tenant A enqueues "
        f"{load.get('flood', 0):,} jobs while the workers are held, then they are released "
        f"and {load.get('quiet_tenants', 0)} quiet tenants enqueue "
        f"{load.get('quiet_rate_per_s', 0):g} jobs/s each for {load.get('quiet_s', 0):g} s, "
        f"on `stream-jobs worker --processes {load.get('processes', 0)}`; each handler "
        f"sleeps {load.get('hold_ms', 0)} ms. Dwell is enqueue to start; A's completion runs "
        "from the release; throughput counts the jobs that ended while A's backlog lasted "
        "(ops/bench/fairness.py says how).")
    out += ["", table(GOAL_COLUMNS, _goal_lines(details, figures)), ""]
    if details.get("arms"):
        out += [table(ARM_COLUMNS, _arm_rows(details)), ""]
    rows = ratio_rows(figures, RATIOS)
    if rows:
        out += [table(RATIO_COLUMNS, rows), ""]
    mine = [f for name, f in figures.items() if name.startswith(fairness_bench.PREFIX)]
    if mine:
        out += [figures_table(mine), ""]
    if error:
        out += [f"**The fairness run failed**: {error}. The tables hold what was measured "
                "before it failed.", ""]
    return out
