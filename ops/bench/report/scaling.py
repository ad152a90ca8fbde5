"""`## Scaling` in RESULTS.md: the scaling run's points (1, 2 and 4 worker processes on
each broker setup and handler) with their efficiency, where the CPU went, and what limits
them on this machine (ops/bench/scaling.py measures them). Pure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ops.bench import scaling as scaling_bench
from ops.bench.report.tables import FigureJSON, fmt, goals_block, table

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


def scaling_section(scaling: dict[str, Any], figures: dict[str, FigureJSON],
                    error: str | None = None) -> list[str]:
    """The `## Scaling` section of RESULTS.md from the scaling run's details."""
    backlogs = scaling.get("backlogs", {})
    cores = int(scaling.get("nproc") or 1)
    quick = " (BENCH_QUICK smoke run: not for quoting)" if scaling.get("quick") else ""
    setups = " and ".join({1: "the stack's single broker",
                           3: "the three-node cluster (`stream-jobs dev up --brokers 3`: "
                              "replication factor 3, min.insync.replicas 2)"}[n]
                          for n in scaling.get("broker_setups", [1, 3]))
    out = [f"## {scaling_bench.HEADING}", ""]
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
    out += goals_block(figures, scaling_bench.GOALS)
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

