"""`## Worker processes` in RESULTS.md: `stream-jobs worker --processes 2`
against `--processes 1` (ops/bench/processes.py), with its goals, the CPU split and what
limits it. Pure: `processes_section(details, figures) -> lines`."""

from __future__ import annotations

import statistics
from typing import Any

from ops.bench import processes as processes_bench
from ops.bench.report.scaling import SCALING_COLUMNS, ScalingPoint, scaling_points, scaling_rows
from ops.bench.report.tables import FigureJSON, fmt, goals_of, goals_table, ratio_of, table

METHOD = (
    "`stream-jobs worker ops.bench.scaling_app:app --type bench.scale-noop --processes N "
    "--until-idle` drains the same no-op backlog, once with N = 1 (the command is the "
    "worker) and once with N = 2 (a supervisor forks two worker processes, each one "
    "member of the type's groups), rotating which goes first. As in Scaling, the command "
    "starts under a near-zero run-time throttle, is released once the group is Stable with "
    "every process in it, and **jobs/s** is the steady window of the completion stamps "
    "(every process still had work). The cores are CPU time in that window over its "
    "length, from /proc: **worker cores** is the command's whole process tree (for N = 2 "
    "the supervisor and its children, reaped ones included), then the broker, Postgres "
    "and the whole machine (every process on the box, other sessions' included).")


EXPECTATIONS = [
    "Why: a worker process is one Python event loop, so it uses one core at most, and the "
    "broker, Postgres and everyone else's work share the same 2 cores. The second process "
    "can only add the CPU the first left idle: on a quiet box most of the second core "
    "(minus what the broker takes for the extra fetches and commits); on a busy one, "
    "whatever share the kernel gives it. The per-core ratio takes that out: near 1.00, a "
    "job costs the same CPU in a supervised child as in a single process (the supervisor "
    "does nothing per job). On a machine with a core per worker process and the broker "
    "elsewhere, `--processes auto` should scale like separate processes do in Scaling, "
    "up to the partitions of the busiest type.",
]


def _split_sentences(points: list[ScalingPoint], details: dict[str, Any],
                     cores: int) -> list[str]:
    found = details.get("cpu_of", {"broker": True, "postgres": True})
    out = []
    if not all(found.values()):
        missing = " and ".join(name for name, seen in found.items() if not seen)
        out.append(f"- The {missing} CPU was not measured: the stack's pid files were not "
                   "found (set STREAM_JOBS_STACK_DIR to the stack's folder), so it reads 0 "
                   "below and CPU per job counts the workers only.")
    for p in points:
        c = p.cores
        ours = c["workers"] + c["brokers"] + c["postgres"]
        out.append(
            f"- `--processes {p.processes}`: {fmt(p.median)} jobs/s; the worker processes "
            f"used {c['workers']:.2f} cores, the broker {c['brokers']:.2f}, Postgres "
            f"{c['postgres']:.2f} ({ours:.2f} together, {p.cpu_ms_per_job:.3f} ms of CPU "
            f"per job), and the whole machine had {c['machine']:.2f} of its {cores} busy. "
            f"At that cost all {cores} cores would carry about "
            f"{fmt(cores / p.cpu_ms_per_job * 1000)} jobs/s.")
    runs = list(details.get("runs", []))
    supervised = [r for r in runs if r["processes"] > 1]
    if supervised:
        spent = statistics.median(r["supervisor_cpu_s"] for r in supervised)
        wall = statistics.median(r["wall_s"] for r in supervised)
        out.append(f"- The supervisor itself (no event loop, no client: it waits for signals) "
                   f"used {spent:.2f} s of CPU over a {wall:.0f} s drain, "
                   f"{spent / max(wall, 1e-9) * 100:.1f}% of a core.")
    return out


def processes_section(details: dict[str, Any], figures: dict[str, FigureJSON],
                      error: str | None = None) -> list[str]:
    """`## Worker processes`: the method, the goals, the table, the CPU split."""
    cores = int(details.get("nproc") or 1)
    quick = " (BENCH_QUICK smoke run: not for quoting)" if details.get("quick") else ""
    out = [f"## {processes_bench.HEADING}", ""]
    out.append(f"Measured on {details.get('measured_at')}{quick} in "
               f"{details.get('took_s', 0) / 60:.1f} min: {details.get('backlog', 0):,} "
               f"no-op jobs on a {details.get('partitions')}-partition topic of the stack's "
               f"broker, each count run {details.get('repeats')} times; jobs/s is the "
               "median, with the spread (min - max). The 1-minute load average went from "
               f"{details.get('load_avg_before', 0):.1f} to "
               f"{details.get('load_avg_after', 0):.1f} on {cores} cores.")
    out += ["", METHOD, ""]
    out.append(goals_table(figures, goals_of(processes_bench.GOALS)))
    runs = list(details.get("runs", []))
    points = scaling_points(runs)
    if points:
        out += ["", table(SCALING_COLUMNS, scaling_rows(points)), ""]
        if "processes.p1" in figures and "processes.p2" in figures:
            value, low, high, how = ratio_of(figures, "processes.p2", "processes.p1")
            out += [f"`--processes 2` / `--processes 1`: {value:.2f}x ({low:.2f}x - "
                    f"{high:.2f}x, {how}).", ""]
        out += ["### Where the CPU goes", "", *_split_sentences(points, details, cores), "",
                *EXPECTATIONS]
    if error:
        out += ["", f"**The processes run failed**: {error}. The table holds the runs "
                "measured before it failed."]
    out.append("")
    return out
