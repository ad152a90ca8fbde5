"""RESULTS.md from results.json: figures with their spread, ratios, and each goal as
MET / NOT MET with by how much. Pure: `render(data) -> str`.

    .venv/bin/python -m ops.bench.report ops/bench/out/results.json > ops/bench/RESULTS.md
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

from ops.bench import control as control_bench
from ops.bench import gateway as gateway_bench
from ops.bench import outbox as outbox_bench
from ops.bench import results as results_bench
from ops.bench import tester as tester_bench

# (name, numerator figure, denominator figure)
RATIOS: list[tuple[str, str, str]] = [
    ("raw aiokafka producer / Kafka ProducerPerformance", "raw.produce", "kafka.produce"),
    ("raw aiokafka consume loop / Kafka ConsumerPerformance", "raw.consume", "kafka.consume"),
    ("enqueue_many / raw aiokafka producer", "ours.enqueue_many", "raw.produce"),
    ("no-op, key / raw consume loop", "ours.noop_key", "raw.consume"),
    ("no-op, unordered / raw consume loop", "ours.noop_unordered", "raw.consume"),
    ("exactly-once, deferred / raw consume loop", "ours.once_deferred", "raw.consume"),
    ("no-op def (thread pool) / no-op async def, side by side", "ours.noop_sync",
     "ours.noop_async_beside_sync"),
    ("no-op def (thread pool) / raw consume loop", "ours.noop_sync", "raw.consume"),
    ("exactly-once, deferred, concurrency 256 / raw consume loop", "ours.once_deferred_256",
     "raw.consume"),
    ("exactly-once, deferred / no-op, key", "ours.once_deferred", "ours.noop_key"),
    ("exactly-once, live connection / raw consume loop", "ours.once", "raw.consume"),
    ("exactly-once, deferred / exactly-once, live connection", "ours.once_deferred",
     "ours.once"),
    ("await ctx.fencing_token / no-op (fencing section)", "ours.fence_token",
     "ours.fence_noop"),
    ("fenced write outside ctx.once() / the same write through ctx.once()",
     "ours.fence_write", "ours.fence_once"),
    ("no-op, token never read (fencing section) / no-op, key (processing section)",
     "ours.fence_noop", "ours.noop_key"),
    ("no-op, key (beside the peers) / Dramatiq no-op", "ours.noop_key_beside",
     "dramatiq.process"),
    ("no-op, key (beside the peers) / Celery no-op", "ours.noop_key_beside", "celery.process"),
    ("awaited enqueue (beside the peers) / Dramatiq enqueue", "ours.enqueue_awaited_beside",
     "dramatiq.enqueue"),
    ("awaited enqueue (beside the peers) / Celery enqueue", "ours.enqueue_awaited_beside",
     "celery.enqueue"),
    ("exactly-once, deferred (its section) / Dramatiq no-op", "ours.once_deferred",
     "dramatiq.process"),
    ("exactly-once, deferred (its section) / Celery no-op", "ours.once_deferred",
     "celery.process"),
    ("enqueue_many (its section) / Dramatiq enqueue", "ours.enqueue_many", "dramatiq.enqueue"),
    ("enqueue_many (its section) / Celery enqueue", "ours.enqueue_many", "celery.enqueue"),
    ("two schedulers, runs per firing: Celery beat / ours", "celery.beat_runs_per_firing",
     "ours.sched_runs_per_firing"),
    ("interval jitter p99 of a 1 s schedule: ours / Celery beat", "ours.sched_jitter_p99",
     "celery.beat_jitter_p99"),
    ("no-op def (its section) / Celery no-op", "ours.noop_sync", "celery.process"),
    ("RSS draining the big backlog / the small one", "ours.rss_big", "ours.rss_small"),
    ("RSS draining the big backlog / the middle one", "ours.rss_big", "ours.rss_mid"),
    ("RSS draining the middle backlog / the small one", "ours.rss_mid", "ours.rss_small"),
    ("no-op, `worker --processes 2` / `--processes 1`", "processes.p2", "processes.p1"),
    ("the same, jobs/s per worker core", "processes.p2_per_core", "processes.p1_per_core"),
    ("outbox through to Kafka / direct enqueue_many (its section)", "outbox.through",
     "outbox.direct"),
    ("tour test: a real worker on the stack / JobTester", "tester.tour_stack",
     "tester.tour_memory"),
    ("no-op jobs: JobTester / a real worker on the stack", "tester.noop_memory",
     "tester.noop_stack"),
]

RETRY_JITTER_MAX_MS = 500.0  # 10% of the 5 s tier (stream_jobs.retry.RetryPolicy)


class FigureJSON(TypedDict):
    """An `ops.bench.common.Figure` as results.json keeps it."""

    name: str
    label: str
    unit: str
    values: list[float]
    note: str
    median: float
    low: float
    high: float


@dataclass(frozen=True)
class Goal:
    text: str
    ratio: tuple[str, str] | None  # (numerator, denominator) or None for a plain figure
    figure: str | None
    op: str  # ">=", "<=" or "<"
    target: float
    unit: str


GOALS: list[Goal] = [
    Goal("enqueue_many >= 0.7x raw aiokafka producer", ("ours.enqueue_many", "raw.produce"),
         None, ">=", 0.7, "x"),
    Goal("awaited enqueue p99 < 20 ms", None, "ours.enqueue_p99", "<", 20.0, "ms"),
    Goal("no-op processing (key) >= 0.5x raw consume loop", ("ours.noop_key", "raw.consume"),
         None, ">=", 0.5, "x"),
    Goal("no-op processing (unordered) >= 0.5x raw consume loop",
         ("ours.noop_unordered", "raw.consume"), None, ">=", 0.5, "x"),
    Goal("no-op processing (key, beside the peers) >= 3x Dramatiq",
         ("ours.noop_key_beside", "dramatiq.process"), None, ">=", 3.0, "x"),
    Goal("no-op processing (key, beside the peers) >= 10x Celery",
         ("ours.noop_key_beside", "celery.process"), None, ">=", 10.0, "x"),
    # The hand-off to a thread and back costs tens of microseconds a job: three quarters
    # of a no-op's throughput at most, small beside the I/O a sync handler is for.
    Goal("no-op def (thread pool) >= 0.25x no-op async def, side by side",
         ("ours.noop_sync", "ours.noop_async_beside_sync"), None, ">=", 0.25, "x"),
    Goal("exactly-once (ctx.once_deferred) >= 0.25x raw consume loop",
         ("ours.once_deferred", "raw.consume"), None, ">=", 0.25, "x"),
    Goal("the same, the type declared with concurrency 256",
         ("ours.once_deferred_256", "raw.consume"), None, ">=", 0.25, "x"),
    Goal("exactly-once (ctx.once, live connection) >= 0.25x raw consume loop",
         ("ours.once", "raw.consume"), None, ">=", 0.25, "x"),
    Goal("a handler reading ctx.fencing_token >= 0.5x a no-op handler (fencing section)",
         ("ours.fence_token", "ours.fence_noop"), None, ">=", 0.5, "x"),
    Goal("p99 end-to-end <= 50 ms at half capacity (end-to-end capacity, producer + worker)",
         None, "ours.e2e_p99", "<=", 50.0, "ms"),
    Goal("the same at half the worker-alone drain rate (the box near saturation)", None,
         "ours.e2e_half_drain_p99", "<=", 50.0, "ms"),
    Goal("RSS(big backlog) <= 1.2x RSS(small backlog)", ("ours.rss_big", "ours.rss_small"),
         None, "<=", 1.2, "x"),
    Goal("5 s retry runs within 5 s + jitter (<= 0.5 s) + 1 s at p99 (cold worker)", None,
         "ours.retry_late_p99", "<=", RETRY_JITTER_MAX_MS + 1000.0, "ms late"),
    Goal("the same, warm worker (its producer has written to the tier before)", None,
         "ours.retry_warm_late_p99", "<=", RETRY_JITTER_MAX_MS + 1000.0, "ms late"),
    Goal("two schedulers on one schedule: each firing runs once (Celery beat: twice)", None,
         "ours.sched_runs_per_firing", "<=", 1.0, "runs"),
    Goal("a firing's handler starts within 1 s of its fire time at p99 (two schedulers)",
         None, "ours.sched_late_p99", "<=", 1000.0, "ms"),
]


def _feature_goals(spec: list[tuple[str, str, str | None, str, float, str]]) -> list[Goal]:
    """A feature module's GOALS rows (text, figure or numerator, denominator or None, op,
    target, unit) as `Goal`s."""
    return [Goal(text, (num, den) if den else None, None if den else num, op, target, unit)
            for text, num, den, op, target, unit in spec]


# The features measured in sections of their own (`BENCH_ONLY=outbox` and so on replace
# only theirs): the outbox, results and batches, cancel/unique/debounce, JobTester.
OUTBOX_GOALS = _feature_goals(outbox_bench.GOALS)
RESULTS_GOALS = _feature_goals(results_bench.GOALS)
CONTROL_GOALS = _feature_goals(control_bench.GOALS)
GATEWAY_GOALS = _feature_goals(gateway_bench.GOALS)
TESTER_GOALS = _feature_goals(tester_bench.GOALS)

# `stream-jobs worker --processes 2` on this 2-core box (ops/bench/processes.py): the second
# process must add most of a core's worth of jobs, and supervising must cost nothing per job.
PROCESSES_GOALS: list[Goal] = [
    Goal("no-op, `worker --processes 2` >= 1.5x `--processes 1` (2 cores)",
         ("processes.p2", "processes.p1"), None, ">=", 1.5, "x"),
    Goal("the same per worker core >= 0.9x (no CPU per job for the supervision)",
         ("processes.p2_per_core", "processes.p1_per_core"), None, ">=", 0.9, "x"),
]
GOALS += PROCESSES_GOALS


def fmt(value: float, unit: str = "") -> str:
    if unit in ("x",):
        return f"{value:.2f}x"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio_of(figures: dict[str, FigureJSON], num: str, den: str) -> tuple[float, float, float, str]:
    """(median ratio, low, high, how the spread was taken)."""
    a, b = figures[num], figures[den]
    median = a["median"] / b["median"]
    if len(a["values"]) == len(b["values"]) > 1:
        paired = [x / y for x, y in zip(a["values"], b["values"], strict=True)]
        return median, min(paired), max(paired), "paired by run"
    return median, a["low"] / b["high"], a["high"] / b["low"], "extremes"


def _met(op: str, value: float, target: float) -> bool:
    return value >= target if op == ">=" else value <= target if op == "<=" else value < target


def _by_how_much(op: str, value: float, target: float, unit: str) -> str:
    if op == ">=":
        pct = (value / target - 1) * 100
        if value >= target:
            return f"{pct:+.0f}% above the target"
        return f"short by {-pct:.0f}%: needs {target / value:.2f}x the measured figure"
    diff = value - target
    amount = f"{abs(diff):.2f}x" if unit == "x" else f"{abs(diff):.1f} {unit.split()[0]}"
    if _met(op, value, target):
        return f"{amount} under the limit"
    return f"over by {amount} ({diff / target * 100:+.0f}%)"


def goal_rows(figures: dict[str, FigureJSON],
              goals: list[Goal] | None = None) -> list[list[str]]:
    rows = []
    for goal in GOALS if goals is None else goals:
        names = list(goal.ratio) if goal.ratio else [goal.figure or ""]
        if any(n not in figures for n in names):
            rows.append([goal.text, "not measured", "", "NOT MEASURED", "", ""])
            continue
        if goal.ratio:
            value, low, high, _ = ratio_of(figures, *goal.ratio)
            a, b = figures[goal.ratio[0]], figures[goal.ratio[1]]
            per_run = ([x / y for x, y in zip(a["values"], b["values"], strict=True)]
                       if len(a["values"]) == len(b["values"]) else [value])
        else:
            fig = figures[goal.figure or ""]
            value, low, high, per_run = fig["median"], fig["low"], fig["high"], fig["values"]
        met = _met(goal.op, value, goal.target)
        unit = goal.unit
        spread = f"{fmt(low, unit)} - {fmt(high, unit)}"
        meeting = sum(_met(goal.op, v, goal.target) for v in per_run)
        rows.append([goal.text, f"{fmt(value, unit)} {'' if unit == 'x' else unit}".strip(),
                     spread, "**MET**" if met else "**NOT MET**",
                     _by_how_much(goal.op, value, goal.target, unit),
                     f"{meeting}/{len(per_run)}"])
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


GROUPS = [
    ("Kafka's own tools (the broker's ceiling)", "kafka."),
    ("Raw aiokafka (the client's ceiling)", "raw."),
    ("stream-jobs", "ours."),
    ("Celery on Redis", "celery."),
    ("Dramatiq on Redis", "dramatiq."),
    ("`stream-jobs worker --processes N`", "processes."),
]


def _figure_rows(figures: dict[str, FigureJSON], prefix: str) -> list[list[str]]:
    rows = []
    for name, f in figures.items():
        if not name.startswith(prefix):
            continue
        rows.append([f["label"], f"{fmt(f['median'])} {f['unit']}",
                     f"{fmt(f['low'])} - {fmt(f['high'])}", str(len(f["values"])),
                     f["note"]])
    return rows


ONCE_FORMS = {"live": "ctx.once(), concurrency 64", "deferred": "ctx.once_deferred(), "
              "concurrency 64", "deferred256": "ctx.once_deferred(), concurrency 256"}


def once_cpu_section(once_cpu: dict[str, Any]) -> list[str]:
    """Where an exactly-once job's CPU goes (the cost behind that goal), per form."""
    out = ["## Where an exactly-once job's CPU goes", "",
           "CPU time per job while each exactly-once drain ran (median of the runs; the "
           "drain call includes start-up and the idle check): this process, which runs "
           "the worker; the broker; Postgres (its server processes, exited backends "
           "included); and the whole machine, which has 2 cores shared by all of them. "
           "1,000 ms divided by the machine's ms per job over its cores bounds the jobs/s "
           "this box could give that form.", ""]
    rows = []
    for name, label in ONCE_FORMS.items():
        if name not in once_cpu:
            continue
        ms = once_cpu[name]["ms_per_job"]
        cores = os.cpu_count() or 1
        rows.append([label, f"{ms['worker']:.3f}", f"{ms['broker']:.3f}",
                     f"{ms['postgres']:.3f}", f"{ms['machine']:.3f}",
                     f"{cores * 1000 / ms['machine']:,.0f}" if ms["machine"] else "-"])
    out.append(table(["form", "worker ms/job", "broker ms/job", "Postgres ms/job",
                       "machine ms/job", "bound on this box (jobs/s)"], rows))
    out.append("")
    return out


def _profile_section(profile: dict[str, Any]) -> list[str]:
    out = ["## Profile of the no-op processing path", ""]
    out.append(f"pyinstrument, 1 ms sampling of the whole thread (event loop included), while "
               f"one worker drained {profile['jobs']:,} no-op jobs (ordering=key): "
               f"{profile['duration_s']:.1f} s wall, {profile['cpu_s']:.1f} s CPU, "
               f"{profile['rate_under_profiler']:,.0f} jobs/s under the profiler. Sampling "
               "runs from the first job to the last (start-up and the idle check are not in "
               "it). Time inside the event loop's C code (uvloop), waiting for the network "
               "included, shows as its own row. Full tree: "
               "`ops/bench/out/run-*/profile.html` and `profile.txt`.")
    out += ["", "**Self time by package** (where the samples landed):", ""]
    out.append(table(["package", "self time (s)", "share"],
                      [[n, f"{t:.2f}", f"{share * 100:.1f}%"]
                       for n, t, share in profile["by_package"]]))
    out += ["", "**Heaviest stream_jobs functions** (inclusive time, counted once per call "
            "chain):", ""]
    out.append(table(["function (module)", "inclusive (s)", "share of all samples"],
                      [[n, f"{t:.2f}", f"{share * 100:.1f}%"]
                       for n, t, share in profile["stream_jobs_functions"]]))
    out += ["", "**Top of the call tree**:", "", "```text", profile["tree"], "```", ""]
    return out



def feature_section(figures: dict[str, FigureJSON], feature: ModuleType, goals: list[Goal],
                    ratios: Sequence[tuple[str, str, str]] = ()) -> list[str]:
    """The section of one feature module (its HEADING, INTRO and PREFIX): goals, the
    ratios measured side by side, then every figure; nothing when it was not measured."""
    mine = {k: v for k, v in figures.items() if k.startswith(feature.PREFIX)}
    if not mine:
        return []
    out = [f"## {feature.HEADING}", "", feature.INTRO, ""]
    out += [table(["goal", "measured (median)", "spread", "status", "by how much",
                   "runs meeting it"], goal_rows(figures, goals)), ""]
    rows = []
    for name, num, den in ratios:
        if num in mine and den in mine:
            value, low, high, how = ratio_of(figures, num, den)
            rows.append([name, f"{value:.2f}x", f"{low:.2f}x - {high:.2f}x", how])
    if rows:
        out += [table(["ratio", "median", "spread", "spread taken"], rows), ""]
    rows = [[f["label"], f"{fmt(f['median'])} {f['unit']}", f"{fmt(f['low'])} - "
             f"{fmt(f['high'])}", str(len(f["values"])), f["note"]] for f in mine.values()]
    out += [table(["figure", "median", "spread (min - max)", "runs", "notes"], rows), ""]
    return out


def render(data: dict[str, Any]) -> str:
    meta = data["meta"]
    figures: dict[str, FigureJSON] = data["figures"]
    details: dict[str, Any] = data["details"]
    machine = meta.get("machine", {})
    out = ["# stream-jobs benchmarks", ""]
    quick = " (BENCH_QUICK smoke run: small N, 1 run; not for quoting)" if meta.get("quick") \
        else ""
    out.append(f"Generated by `make bench` ({'`ops/bench/run.py`'}) on {meta.get('started_at')}"
               f"{quick}; the whole run took {meta.get('total_s', 0) / 60:.1f} min. Every "
               "figure is the median of the runs, with the spread (min - max); every ratio "
               "compares figures measured side by side in this one run on this machine. "
               "Do not compare these numbers with another machine's: compare the ratios.")
    loads = list(details.get("load_avg_after", {}).values())
    cores = machine.get("nproc") or 1
    if loads and max(loads) > cores:
        out += ["", f"**The box was shared with other work during this run**: the 1-minute "
                f"load average after the sections ranged {min(loads):.1f} to {max(loads):.1f} "
                f"on {cores} cores (see the Run table). The spreads carry that noise; the "
                "ratios, taken side by side, carry less of it."]
    out += ["", "## Goals", ""]
    out.append(table(["goal", "measured (median)", "spread", "status", "by how much",
                       "runs meeting it"], goal_rows(figures)))
    out += ["", "Ratios are of medians; a ratio's spread pairs the two figures run by run "
            "(the sections rotate the order of their contenders from run to run).", ""]
    out += ["## Figures", ""]
    for title, prefix in GROUPS:
        rows = _figure_rows(figures, prefix)
        if rows:
            out += [f"### {title}", "",
                    table(["figure", "median", "spread (min - max)", "runs", "notes"], rows),
                    ""]
    ratio_rows = []
    for name, num, den in RATIOS:
        if num in figures and den in figures:
            value, low, high, how = ratio_of(figures, num, den)
            ratio_rows.append([name, f"{value:.2f}x", f"{low:.2f}x - {high:.2f}x", how])
    out += ["## Ratios", "", table(["ratio", "median", "spread", "spread taken"], ratio_rows),
            ""]
    mem = details.get("memory_runs")
    if mem:
        out += ["## Memory detail", "",
                "Each run is a `stream-jobs worker ops.bench.apps:app --type bench.mem "
                "--until-idle` process; VmRSS and VmHWM sampled every 200 ms from "
                "/proc/<pid>/status; CPU is user+sys from the process's rusage, start-up "
                "included.", ""]
        rows = []
        for size, runs in mem.items():
            for i, run in enumerate(runs):
                rows.append([f"{size} #{i + 1}", f"{run['max_rss_mb']:.1f}",
                             f"{run['peak_hwm_mb']:.1f}",
                             " / ".join(f"{run[f'rss_mb_at_{q}pct']:.0f}"
                                        for q in (10, 25, 50, 75, 100)),
                             f"{run['cpu_ms_per_1k']:.0f}", f"{run['elapsed_s']:.0f}",
                             f"{run['jobs_per_s_incl_startup']:,.0f}"])
        out.append(table(["backlog", "max RSS (MiB)", "peak HWM (MiB)",
                           "RSS at 10/25/50/75/100% of the drain (MiB)", "CPU ms / 1k jobs",
                           "drain (s)", "jobs/s incl. start-up"], rows))
        out.append("")
    if "scaling" in details:
        out += scaling_section(details["scaling"], data.get("errors", {}).get("scaling"))
    if "processes" in details:
        # Its own module (it builds on this one's tables): imported here, not at the top.
        from ops.bench.report_processes import processes_section

        out += processes_section(details["processes"], figures,
                                 data.get("errors", {}).get("processes"))
    out += feature_section(figures, outbox_bench, OUTBOX_GOALS)
    out += feature_section(figures, results_bench, RESULTS_GOALS, results_bench.RATIOS)
    out += feature_section(figures, control_bench, CONTROL_GOALS, control_bench.RATIOS)
    out += feature_section(figures, gateway_bench, GATEWAY_GOALS, gateway_bench.RATIOS)
    out += feature_section(figures, tester_bench, TESTER_GOALS)
    out += ["## Machine and versions", ""]
    rows = [[k, str(v)] for k, v in machine.items()]
    rows += [[k, str(v)] for k, v in meta.get("versions", {}).items()]
    out += [table(["", ""], rows), ""]
    out += ["## Settings", "", table(["", ""], [[k, str(v)] for k, v in
                                                 meta.get("settings", {}).items()]), ""]
    out += ["## How each figure is taken", "", *METHOD, ""]
    if "profile" in details:
        out += _profile_section(details["profile"])
    if "once_cpu" in details:
        out += once_cpu_section(details["once_cpu"])
    steps = details.get("latency_capacity_steps")
    if steps:
        out += ["## Latency detail", "", "The end-to-end capacity search: a worker and a "
                "paced producer process, the offered rate raised a tenth of the no-op drain "
                "rate at a time until a step did not keep up (the pacer offered less than "
                "97% of the rate, or p99 went over 1 s: a backlog building). Latencies in "
                "ms.", ""]
        rows = [[f"{step['rate']:,.0f}", f"{step['offered_per_s']:,.0f}",
                 f"{step['started_per_s']:,.0f}", f"{step['p50']:.1f}", f"{step['p99']:.1f}",
                 "yes" if step["kept_up"] else "no"] for step in steps]
        out += [table(["asked (jobs/s)", "offered", "started", "p50", "p99", "kept up"],
                       rows), ""]
    retry_runs = details.get("retry_runs")
    if retry_runs:
        out += ["## Retry detail", "", "Lateness of each run's retries against 5 s (ms), and "
                "the relay's counters (a hop is a record taken from a tier before it was due "
                "and written back to a tier).", ""]
        rows = []
        seen: dict[str, int] = {}
        for run in retry_runs:
            late = run["late_ms"]
            kind = "warm" if run.get("warm") else "cold"
            seen[kind] = seen.get(kind, 0) + 1
            rows.append([f"{kind} #{seen[kind]}", f"{late[0]:.0f}",
                         f"{late[len(late) // 2]:.0f}",
                         f"{late[min(len(late) - 1, len(late) * 9 // 10)]:.0f}",
                         f"{late[-1]:.0f}", str(sum(1 for v in late if v > 1500)),
                         str(run.get("relay_released")), str(run.get("relay_hops"))])
        out += [table(["run", "min", "p50", "p90", "max", "over 1.5 s", "relay released",
                        "relay hops"], rows), ""]
    fills = {k: v for k, v in details.items() if k.endswith("_fill_jobs_per_s")}
    if fills:
        out += ["Backlog fills (enqueue_many, for reference): " + ", ".join(
            f"{k.removesuffix('_fill_jobs_per_s')} {v:,.0f} jobs/s" for k, v in fills.items()),
            ""]
    loads = details.get("load_avg_after", {})
    out += ["## Run", "", "The 1-minute load average after each section shows how busy the "
            "box was (2 cores; other work on the box counts too).", "",
            table(["section", "seconds", "load average after"],
                   [[k, f"{v:.0f}", f"{loads.get(k, float('nan')):.1f}"]
                    for k, v in data["timings_s"].items()]), ""]
    if data.get("errors"):
        out += ["### Sections that failed", ""]
        out += [f"- **{name}**: {text}" for name, text in data["errors"].items()]
        out.append("")
    return "\n".join(out)


# -- the scaling run -----------------------------------------------------------------------

SCALING_HEADING = "Scaling"
HANDLER_NAMES = {"noop": "no-op", "once": "exactly-once"}


def efficiency(rate: float, processes: int, one_process_rate: float) -> float:
    """Throughput per process relative to one process: 1.0 is perfectly linear scaling."""
    if processes < 1 or one_process_rate <= 0:
        raise ValueError("efficiency needs at least one process and a positive 1-process rate")
    return rate / (processes * one_process_rate)


@dataclass(frozen=True)
class ScalingPoint:
    """One (brokers, handler, processes) point over its repeats."""

    brokers: int
    handler: str
    processes: int
    rates: tuple[float, ...]  # in repeat order
    first_to_last: tuple[float, ...]
    cores: dict[str, float]  # median cores busy in the steady window, per part
    cpu_ms_per_job: float  # workers + broker(s) + Postgres, median over the repeats
    jobs_per_worker_core: float  # jobs/s over the cores the workers used, median
    efficiency: float  # of the medians
    efficiency_low: float  # repeat by repeat, against the same repeat's 1-process rate
    efficiency_high: float
    core_efficiency: float  # jobs/s per worker core over the 1-process figure

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def name(self) -> str:
        return f"{HANDLER_NAMES.get(self.handler, self.handler)}, {self.brokers} broker" + (
            "s" if self.brokers > 1 else "")


def _per_core(runs: list[dict[str, Any]]) -> float:
    return float(statistics.median(r["rate"] / max(float(r["cores"]["workers"]), 1e-9)
                                   for r in runs))


def scaling_points(runs: list[dict[str, Any]]) -> list[ScalingPoint]:
    """The runs of the scaling section grouped by point, with efficiency against the same
    broker setup's and handler's 1-process runs (paired by repeat for the spread)."""
    groups: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for run in sorted(runs, key=lambda r: (r["brokers"], r["handler"], r["processes"],
                                           r["repeat"])):
        groups.setdefault((run["brokers"], run["handler"], run["processes"]), []).append(run)
    points = []
    for (brokers, handler, processes), found in groups.items():
        single = groups.get((brokers, handler, 1))
        if not single:
            continue  # no 1-process run to compare with
        rates = tuple(float(r["rate"]) for r in found)
        base = {r["repeat"]: float(r["rate"]) for r in single}
        paired = [efficiency(float(r["rate"]), processes, base[r["repeat"]])
                  for r in found if r["repeat"] in base]
        value = efficiency(statistics.median(rates), processes,
                           statistics.median(base.values()))
        cores = {part: statistics.median(float(r["cores"][part]) for r in found)
                 for part in ("workers", "brokers", "postgres", "machine")}
        cpu_ms = statistics.median(
            (r["cores"]["workers"] + r["cores"]["brokers"] + r["cores"]["postgres"])
            / r["rate"] * 1000 for r in found)
        per_core = _per_core(found)
        points.append(ScalingPoint(
            brokers, handler, processes, rates,
            tuple(float(r["first_to_last_rate"]) for r in found), cores, cpu_ms, per_core,
            value, min(paired, default=value), max(paired, default=value),
            per_core / _per_core(single)))
    return points


SCALING_COLUMNS = ["processes", "brokers", "handler", "jobs/s", "spread (min - max)",
                   "efficiency", "efficiency spread", "worker cores", "jobs/s per worker core",
                   "per-core efficiency", "broker(s) / Postgres / machine cores",
                   "CPU ms / job", "first -> last jobs/s"]


def scaling_rows(points: list[ScalingPoint]) -> list[list[str]]:
    rows = []
    for p in points:
        c = p.cores
        rows.append([str(p.processes), str(p.brokers), HANDLER_NAMES.get(p.handler, p.handler),
                     f"{fmt(p.median)}", f"{fmt(min(p.rates))} - {fmt(max(p.rates))}",
                     f"{p.efficiency:.2f}",
                     f"{p.efficiency_low:.2f} - {p.efficiency_high:.2f}",
                     f"{c['workers']:.2f}", f"{fmt(p.jobs_per_worker_core)}",
                     f"{p.core_efficiency:.2f}",
                     f"{c['brokers']:.2f} / {c['postgres']:.2f} / {c['machine']:.2f}",
                     f"{p.cpu_ms_per_job:.3f}", f"{fmt(statistics.median(p.first_to_last))}"])
    return rows


def _share_sentences(points: list[ScalingPoint], scaling: dict[str, Any],
                     cores: int) -> list[str]:
    """How much of the box the workers got, from the figures."""
    out = []
    loads = f"{scaling.get('load_avg_before', 0):.1f} to {scaling.get('load_avg_after', 0):.1f}"
    busy = [p.cores["machine"] for p in points]
    out.append(f"- The box was shared: the 1-minute load average went from {loads} on "
               f"{cores} cores, and in the steady windows the whole machine had "
               f"{min(busy):.2f} to {max(busy):.2f} of its {cores} cores busy, this run's "
               "processes and everyone else's.")
    for p in points:
        if p.processes != 1:
            continue
        top = max((q for q in points if (q.brokers, q.handler) == (p.brokers, p.handler)),
                  key=lambda q: q.processes)
        out.append(f"- {p.name}: 1 worker process got {p.cores['workers']:.2f} of a core; "
                   f"{top.processes} got {top.cores['workers']:.2f} cores together. Jobs/s "
                   "per worker core at "
                   + " / ".join(str(q.processes) for q in points
                                if (q.brokers, q.handler) == (p.brokers, p.handler))
                   + " processes: "
                   + " / ".join(fmt(q.jobs_per_worker_core) for q in points
                                if (q.brokers, q.handler) == (p.brokers, p.handler))
                   + f" (per-core efficiency {top.core_efficiency:.2f} at {top.processes}).")
    brokers = {n: statistics.median(q.cores["brokers"] for q in points
                                    if q.brokers == n and q.handler == "noop")
               for n in (1, 3) if any(q.brokers == n and q.handler == "noop" for q in points)}
    if len(brokers) == 2:
        out.append(f"- Kafka's own share, no-op points: the single broker used {brokers[1]:.2f} "
                   f"of a core, the three-node cluster {brokers[3]:.2f} (three JVMs, and every "
                   "offset commit replicated twice), CPU the workers on this box could not "
                   "have.")
    above = [f"{q.name}, {q.processes} processes ({q.efficiency:.2f})" for q in points
             if q.processes > 1 and q.efficiency > 1.0]
    if above:
        out.append("- Efficiency above 1.00 (" + "; ".join(above) + ") is the scheduler, "
                   "not the code: the kernel shares the cores among all runnable processes "
                   "on the box, so N worker processes take about N shares from the other "
                   "sessions' work, where one process gets one.")
    return out


def _ceiling_sentences(points: list[ScalingPoint], cores: int) -> list[str]:
    """For the largest process count: the CPU per job and the ceiling the cores put on it."""
    out = []
    top = max((p.processes for p in points), default=1)
    for p in points:
        if p.processes != top:
            continue
        ours = p.cores["workers"] + p.cores["brokers"] + p.cores["postgres"]
        ceiling = cores / p.cpu_ms_per_job * 1000
        out.append(
            f"- {p.name}, {p.processes} processes: {fmt(p.median)} jobs/s using {ours:.2f} "
            f"cores (workers {p.cores['workers']:.2f}, broker(s) {p.cores['brokers']:.2f}, "
            f"Postgres {p.cores['postgres']:.2f}), {p.cpu_ms_per_job:.3f} ms of CPU per job: "
            f"all {cores} cores would cap it near {fmt(ceiling)} jobs/s.")
    return out


SCALING_EXPECTATIONS = [
    "Why the figures look like this: each worker process is one Python event loop, so it "
    "uses at most one core, and every job also costs the broker (fetch and offset commit; "
    "on the cluster, replication too) and, for exactly-once, Postgres (the dedup and "
    "effect rows, a commit per group). On this box all of them share 2 cores with each "
    "other and with the other sessions' work, so the wall-clock efficiency mostly "
    "measures how much CPU the workers were given, which changed from minute to minute. "
    "The jobs/s per worker core column takes that out: near 1.00 per-core efficiency, "
    "more processes cost no extra CPU per job; below it, each job costs more. For "
    "exactly-once a fall is expected from group commit: the same rate split over more "
    "processes gives each one's transactions fewer jobs, so each commit's cost is shared "
    "by fewer jobs (a longer `STREAM_JOBS_DEDUP_LINGER_MS` offsets that; see "
    "docs/capacity.md).",
    "",
    "What to expect on real hardware (inference, not measured here): with a core per "
    "worker process and the brokers and Postgres on machines of their own, each process "
    "runs at about the jobs/s per worker core above, so throughput grows close to "
    "linearly with processes until the next limit: the partitions (one busy process per "
    "partition at most: 12 here), the brokers' network and disk, or, for exactly-once, "
    "Postgres's commit rate (more processes mean more commits, each with fewer jobs). "
    "Size a deployment from figures measured on its own hardware "
    "(`BENCH_ONLY=scaling make bench` there), with headroom, not from this table's "
    "absolute numbers.",
]


def scaling_section(scaling: dict[str, Any], error: str | None = None) -> list[str]:
    """The `## Scaling` section of RESULTS.md from the scaling run's details."""
    backlogs = scaling.get("backlogs", {})
    cores = int(scaling.get("nproc") or 1)
    quick = " (BENCH_QUICK smoke run: not for quoting)" if scaling.get("quick") else ""
    setups = " and ".join({1: "the stack's single broker",
                           3: "the three-node cluster (`stream-jobs dev up --brokers 3`: "
                              "replication factor 3, min.insync.replicas 2)"}[n]
                          for n in scaling.get("broker_setups", [1, 3]))
    out = [f"## {SCALING_HEADING}", ""]
    out.append(
        f"Measured on {scaling.get('measured_at')}{quick} in "
        f"{scaling.get('took_s', 0) / 60:.1f} min. 1, 2 and 4 `stream-jobs worker` processes "
        f"of one type drain a backlog on a {scaling.get('partitions')}-partition topic: "
        f"{backlogs.get('noop', 0):,} jobs with a no-op handler, {backlogs.get('once', 0):,} "
        "with an exactly-once one (one effect row through `ctx.once()`, group commit on), on "
        f"{setups}. Each point ran {scaling.get('repeats')} times, the order rotating between "
        "repeats; jobs/s is the median, with the spread (min - max). The box is shared and "
        "noisy (see below): compare the ratios within this table, not its numbers with "
        "another run's.")
    out += ["", "How it is taken: the processes start while the type is held by a run-time "
            "throttle (`stream-jobs throttle`, a near-zero rate), and are released together "
            "by resetting it once the consumer group is Stable with all of them, so none "
            "drains the backlog alone while the others start. **jobs/s** is the steady "
            "window: from the moment the last process finished its first job after the "
            "release to the moment the first process finished its last (every process "
            "still had work); start-up, the group join and the drain's tail are outside it. "
            "**efficiency** is throughput per process relative to one process, jobs/s(N) / "
            "(N x jobs/s(1)), same brokers and handler (1.00 is linear); its spread pairs "
            "each repeat with the same repeat's 1-process run. **worker cores** and the "
            "other cores columns are CPU time in the steady window over its length, from "
            "/proc (machine: every process on the box, other sessions' included). "
            "**jobs/s per worker core** divides jobs/s by the worker cores; **per-core "
            "efficiency** is that over the 1-process figure. **CPU ms / job** adds the "
            "workers', broker(s)' and Postgres's cores and divides by jobs/s. "
            "**first -> last** is the plain rate from the first job any process finished "
            "after the release to the last, the drain's tail included.", ""]
    points = scaling_points(list(scaling.get("runs", [])))
    if points:
        out.append(table(SCALING_COLUMNS, scaling_rows(points)))
        out += ["", "### What limits it on this machine", "",
                f"This machine has {cores} cores; the workers, the broker (or the cluster's "
                "three) and Postgres all run on them, beside the other sessions' work.", "",
                *_share_sentences(points, scaling, cores), "",
                *_ceiling_sentences(points, cores), "", *SCALING_EXPECTATIONS]
    if error:
        out += ["", f"**The scaling run failed**: {error}. The table holds the points "
                "measured before it failed."]
    out.append("")
    return out


# -- a partial run (BENCH_ONLY) merges its own sections into RESULTS.md ---------------------

# Bench sections whose results appear only under their own `## heading` of RESULTS.md, so
# a partial run can replace that heading and keep the rest of the file. The other
# sections feed the shared Goals, Figures and Ratios tables.
PROCESSES_HEADING = "Worker processes"
OWN_HEADINGS: dict[str, str] = {"scaling": SCALING_HEADING, "processes": PROCESSES_HEADING,
                               "outbox": outbox_bench.HEADING, "tester": tester_bench.HEADING,
                               "control": control_bench.HEADING,
                               "gateway": gateway_bench.HEADING,
                               "results": results_bench.HEADING}


def split_sections(text: str) -> list[tuple[str, str]]:
    """(heading, block) for each `## ` section of a document, in order; the text before
    the first one comes first with heading ""."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        sections[-1][1].append(line)
    return [(heading, "".join(lines)) for heading, lines in sections]


def merge_sections(old: str, new: str, headings: Iterable[str]) -> str:
    """`old` with each `## heading` section named in `headings` taken from `new`.

    A section `old` lacks is inserted before the first section that follows it in `new`
    and exists in `old` (else at the end); one `new` lacks is left as it was in `old`.
    Everything else in `old` is kept byte for byte.
    """
    wanted = set(headings)
    fresh = dict(split_sections(new))
    order = [heading for heading, _ in split_sections(new)]
    merged = [(h, fresh[h] if h in wanted and h in fresh else block)
              for h, block in split_sections(old)]
    present = {h for h, _ in merged}
    for heading in order:
        if heading not in wanted or heading in present:
            continue
        block = fresh[heading]
        later = order[order.index(heading) + 1:]
        at = next((i for i, (h, _) in enumerate(merged) if h in later and h), len(merged))
        if at == len(merged) and merged and not merged[-1][1].endswith("\n\n"):
            block = "\n" + block
        merged.insert(at, (heading, block))
        present.add(heading)
    return "".join(block for _, block in merged)


METHOD = [
    "- **Kafka tools**: `ProducerPerformance`, `ConsumerPerformance` (its fetch rate, "
    "without the group join) and `EndToEndLatency` (acks=all, one message at a time, "
    "linger 0) from the broker's own jars, on 6-partition topics made by `stream-jobs`' "
    "admin, records as large as ours on the wire.",
    "- **Raw aiokafka producer**: JobProducer's settings, the same value, key and header "
    "bytes, every `send()` pipelined and then every future awaited; first send to last ack.",
    "- **Raw aiokafka consume loop**: `getmany(max_records=500)` then `commit()` per batch, "
    "counting records, on the same backlog the worker drains, from the first batch to the "
    "last record.",
    "- **enqueue_many**: `JobClient.enqueue_many` of 500 `Job`s at a time, each call awaited "
    "(all acks) before the next. **Awaited enqueue**: `await client.enqueue(...)` one by "
    "one; each call's latency is its own round trip including linger.",
    "- **Processing**: `Worker.run(until_idle=True)` in-process over a pre-filled backlog "
    "(6 partitions), timed from the first handler call to the last (start-up, group join "
    "and the idle check are left out and reported separately). The backlog is filled once; "
    "between runs the worker group is rewound to offset 0 with `reset_offsets`. Each "
    "run drains the raw loop, unordered and key in a rotated order.",
    "- **Sync handlers**: a no-op `def` handler (run on the worker's pool: 64 threads at "
    "the default concurrency 64) and a no-op `async def` drain the same backlog in one run, "
    "each as the processing figures are taken (ordering=key, first handler call to the "
    "last), rotating which goes first; the worker group is rewound between them. The "
    "`def` pays a hand-off to a pool thread and back per job (a queue put, a thread "
    "wake-up, `call_soon_threadsafe`) and shares the GIL with the loop.",
    "- **Exactly-once**: the handler inserts one row, once through `ctx.once_deferred()` "
    "(the statement is recorded; many jobs' dedup rows and effects are applied together, "
    "one claim statement and one pipelined `executemany` per batch) and once through "
    "`ctx.once()` (a live connection: each job's claim and effect are round trips in its "
    "own savepoint of a shared transaction), both at the default concurrency of 64, and "
    "the deferred form again at concurrency 256 (what an I/O-bound type would declare: "
    "more jobs wait for each commit, so batches are bigger); all three in every run, "
    "rotating which goes first. The tables are truncated between runs and the row count "
    "is checked to equal N.",
    "- **Fencing tokens**: a quarter of the processing backlog, drained in every run by "
    "four handlers in a rotated order: a no-op that never reads `ctx.fencing_token`, one "
    "that awaits it and does nothing else (a `nextval` of the dedup database's sequence; "
    "requests made while one is in flight share the next round trip), one that awaits it "
    "and upserts one row per job through docs/fencing.md's fenced write on a pool of its "
    "own (autocommit, so a commit per job: a store outside the dedup transaction), and the "
    "same upsert through `ctx.once()` (group commit). Each drain checks that the sequence "
    "moved by exactly N for the contenders that read the token (0 for the others) and "
    "that the writing ones left N rows.",
    "- **End-to-end latency**: a worker runs (key ordering); a separate paced process "
    "offers a rate, every 2 ms sending the jobs due as one `enqueue_many` (the rate it "
    "achieved is reported); the handler records now - `ctx.enqueued_at` (stamped by "
    "`enqueue` before sending, so linger and the ack are inside) into two arrays of "
    "doubles (a list of tuples filled the worker's young generation: one collection "
    "walked 50,000 of them, a 46 ms pause); the pacer keeps only failed batches. The "
    "first second is dropped. Capacity is the end-to-end capacity, searched first in "
    "the same way: the "
    "offered rate rises a tenth of the worker's no-op drain rate at a time until a step "
    "does not keep up (see the latency detail); the last step that kept up is what "
    "producer, broker and worker carry together. The goal is judged at half of it, three "
    "runs (and a quarter is reported). The producer costs "
    "about as much CPU per job as the worker, and both share the box's 2 cores with the "
    "broker, so half the worker-alone drain rate (also reported, the measure of earlier "
    "runs) offers close to what the box can carry at all.",
    "- **Memory**: see the memory detail. The 1,000,000-job backlog is drained once, not "
    "three times: filling it at enqueue_many speed and draining it take about two minutes "
    "each, and three drains would not fit the ~20-minute budget. Its RSS curve over the "
    "drain (10% to 100%) stands in for the spread: it shows whether memory grows with the "
    "jobs behind the worker. The 10,000- and 100,000-job backlogs are drained three times "
    "each (rewound between runs); the 100,000 one tells a plateau (buffers full) from "
    "growth with the backlog.",
    "- **Retry accuracy**: N jobs each fail once on attempt 1; the gap from the failure to "
    "attempt 2's start, minus 5 s. The tier adds up to 10% jitter (<= 0.5 s). Cold: a fresh "
    "worker meets the N jobs as a backlog, so its first failures are its producer's first "
    "writes to the tier topic. Warm: the running worker has already retried one canary job "
    "when the N jobs are enqueued.",
    "- **Schedules**: two `Scheduler`s of one type in the bench process (one leads by the "
    "advisory lock) and a worker run a 1 s schedule (`every = \"1s\"`) for the window, the "
    "handler stamping each run; beside them, in a rotated order, two `celery beat` "
    "processes (each its own schedule file and pidfile, as a team running two for "
    "failover would) and one solo worker run a 1 s beat entry on the bench's Redis. The "
    "first 2 s are left out. Runs per firing: ours, handler runs over distinct firing IDs; "
    "Celery, runs per second of the entry. Lateness: a run's start less its fire time "
    "(from the firing's job ID; Celery's tasks carry no fire time). Jitter: per stream of "
    "runs (ours: the firings; Celery: each beat's), |interval - 1 s| at p99.",
    "- **Celery / Dramatiq**: their own venv, Redis 127.0.0.1:6390 without persistence, "
    "N no-op tasks enqueued one by one (timed), then the workers started and timed from "
    "their first task to their last (counted in memory per process, flushed to Redis every "
    "100 ms: no broker round trip per task). Celery: 2 worker processes with the solo pool "
    "(the fastest of solo, threads, prefork and gevent for a no-op task in a pilot on this "
    "box: about 600, 490, 410 and 400 tasks/s), prefetch multiplier 128 (Celery's advice "
    "for many short tasks), results ignored, early acks. Dramatiq: 2 processes x 8 threads "
    "(its defaults here), default middleware. Ours runs in the same rotation (awaited "
    "enqueues of N jobs, then a drain of a 5N backlog), so the ratios to the peers are "
    "side by side; figures marked 'its section' were measured minutes apart.",
]


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("ops/bench/out/results.json")
    print(render(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
