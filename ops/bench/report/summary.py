"""The shared tables at the top of RESULTS.md, which every section without a heading of
its own feeds (and the processes run, whose goals count among them): Goals, Figures and
Ratios, then the memory run's detail."""

from __future__ import annotations

from typing import Any

from ops.bench import processes as processes_bench
from ops.bench.report.tables import (
    RATIO_COLUMNS,
    FigureJSON,
    Goal,
    figures_table,
    goals_of,
    goals_table,
    ratio_rows,
    table,
)

# (name, numerator figure, denominator figure)
RATIOS: list[tuple[str, str, str]] = [
    ("raw aiokafka producer / Kafka ProducerPerformance", "raw.produce", "kafka.produce"),
    ("raw aiokafka consume loop / Kafka ConsumerPerformance", "raw.consume", "kafka.consume"),
    ("strongest raw aiokafka loop / Kafka ConsumerPerformance", "raw.consume_strong",
     "kafka.consume"),
    ("strongest raw aiokafka loop / plain raw consume loop", "raw.consume_strong",
     "raw.consume"),
    ("enqueue_many / raw aiokafka producer", "ours.enqueue_many", "raw.produce"),
    ("no-op, key / strongest raw aiokafka loop", "ours.noop_key", "raw.consume_strong"),
    ("no-op, unordered / strongest raw aiokafka loop", "ours.noop_unordered",
     "raw.consume_strong"),
    ("no-op, key / Kafka ConsumerPerformance", "ours.noop_key", "kafka.consume"),
    ("no-op, key / raw consume loop", "ours.noop_key", "raw.consume"),
    ("no-op, unordered / raw consume loop", "ours.noop_unordered", "raw.consume"),
    ("exactly-once, deferred / raw consume loop", "ours.once_deferred", "raw.consume"),
    ("exactly-once, live ctx.once() / raw consume loop", "ours.once", "raw.consume"),
    ("ctx.once() / a hand-written idempotency key", "ours.once", "ours.once_by_hand"),
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
    ("one await of nothing / no-op (fencing section): what suspending costs",
     "ours.fence_pause", "ours.fence_noop"),
    ("await ctx.fencing_token / one await of nothing: what the token adds",
     "ours.fence_token", "ours.fence_pause"),
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


GOALS: list[Goal] = [
    Goal("enqueue_many >= 0.7x raw aiokafka producer", ("ours.enqueue_many", "raw.produce"),
         None, ">=", 0.7, "x"),
    Goal("awaited enqueue p99 < 20 ms", None, "ours.enqueue_p99", "<", 20.0, "ms"),
    # The denominator is the strongest raw loop this box runs (ops/bench/raw.py), with
    # Kafka's own Java consumer beside it (issue 29 §3).
    Goal("no-op processing (key) >= 0.8x the strongest raw aiokafka loop",
         ("ours.noop_key", "raw.consume_strong"), None, ">=", 0.8, "x"),
    Goal("no-op processing (unordered) >= 0.8x the strongest raw aiokafka loop",
         ("ours.noop_unordered", "raw.consume_strong"), None, ">=", 0.8, "x"),
    Goal("no-op processing (key) >= 0.25x Kafka ConsumerPerformance",
         ("ours.noop_key", "kafka.consume"), None, ">=", 0.25, "x"),
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
    Goal("the same >= 2x a hand-written idempotency key (a transaction per job), side by side",
         ("ours.once", "ours.once_by_hand"), None, ">=", 2.0, "x"),
    Goal("a handler reading ctx.fencing_token >= 0.5x a no-op handler (fencing section)",
         ("ours.fence_token", "ours.fence_noop"), None, ">=", 0.5, "x"),
    Goal("p99 end-to-end <= 50 ms at half capacity (end-to-end capacity, producer + worker)",
         None, "ours.e2e_p99", "<=", 50.0, "ms"),
    Goal("end-to-end p99 at 80% of the end-to-end capacity <= 100 ms", None,
         "ours.e2e_80_p99", "<=", 100.0, "ms"),
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

# `stream-jobs worker --processes 2` (its section, ops/bench/processes.py) counts here too.
GOALS += goals_of(processes_bench.GOALS)

GROUPS = [
    ("Kafka's own tools (the broker's ceiling)", "kafka."),
    ("Raw aiokafka (the client's ceiling)", "raw."),
    ("stream-jobs", "ours."),
    ("Celery on Redis", "celery."),
    ("Dramatiq on Redis", "dramatiq."),
    ("`stream-jobs worker --processes N`", "processes."),
]


def summary_sections(figures: dict[str, FigureJSON]) -> list[str]:
    """`## Goals`, `## Figures` (by group) and `## Ratios`."""
    out = ["## Goals", "", goals_table(figures, GOALS)]
    out += ["", "Ratios are of medians; a ratio's spread pairs the two figures run by run "
            "(the sections rotate the order of their contenders from run to run).", ""]
    out += ["## Figures", ""]
    for title, prefix in GROUPS:
        group = [f for name, f in figures.items() if name.startswith(prefix)]
        if group:
            out += [f"### {title}", "", figures_table(group), ""]
    out += ["## Ratios", "", table(RATIO_COLUMNS, ratio_rows(figures, RATIOS)), ""]
    return out


def memory_section(details: dict[str, Any]) -> list[str]:
    """`## Memory detail`: a row per drain of each backlog; nothing when it did not run."""
    mem = details.get("memory_runs")
    if not mem:
        return []
    out = ["## Memory detail", "",
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
    return out
