"""`## Kafka share groups` in RESULTS.md: share consumers against our consumer-group worker
on one 2-partition backlog, and a consumer killed holding records
(ops/bench/share_groups.py). Pure: `share_section(details, figures) -> lines`."""

from __future__ import annotations

from typing import Any

from ops.bench import share_groups as share_bench
from ops.bench.report.tables import RATIO_COLUMNS, FigureJSON, figures_table, fmt, ratio_rows, table

RUN_COLUMNS = ["run", "handler", "contender", "drain", "start to last", "start to first job",
               "records per consumer", "largest poll", "broker CPU", "broker CPU per job",
               "broker busy just before", "load avg after"]
KILL_COLUMNS = ["topic", "records the killed one held", "handled by the other before the "
                "kill", "kill to the first delivered again", "kill to the last record",
                "delivery counts seen"]
CASES = [("redeliver", "2 partitions, 2 consumers"), ("redeliver1", "1 partition, 2 consumers")]


def _contender(run: dict[str, Any]) -> str:
    who = f"share x{run['consumers']}" if run["name"].startswith("s") else "our worker"
    return f"{who}, concurrency {run['concurrency']}"


def _run_rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for run in runs:
        handler = "no-op" if run["handler"] == "noop" else f"{run['sleep_ms']} ms sleep"
        shared = "per_consumer" in run
        rows.append([str(run["run"]), handler, _contender(run), f"{fmt(run['rate'])} jobs/s",
                     f"{fmt(run['start_to_last_rate'])} jobs/s", f"{run['join_s']:.2f} s",
                     " / ".join(f"{c:,}" for c in run["per_consumer"]) if shared else "",
                     f"{run['max_batch']:,}" if shared else "",
                     f"{run['broker_cpu_s']:.2f} s", f"{fmt(run['broker_us_per_job'])} us",
                     f"{run.get('broker_background', 0.0):.2f} cores",
                     f"{run['load_avg_after']:.1f}"])
    return rows


def _kill_rows(details: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, topic in CASES:
        case = details.get(key)
        if case is None:
            continue
        if "failed" in case:
            rows.append([topic, "", "", f"failed: {case['failed']}", "", ""])
            continue
        counts = ", ".join(f"{n:,} x {k}" for k, n in case["delivery_counts"].items())
        rows.append([topic, f"{case['acquired']:,}", f"{case['before_kill']:,}",
                     f"{case['kill_to_first_s']:.2f} s", f"{case['kill_to_last_s']:.2f} s",
                     counts])
    return rows


def _group_settings(details: dict[str, Any]) -> str:
    configs: dict[str, str] = next((c["group_configs"] for key, _ in CASES
                    if "group_configs" in (c := details.get(key) or {})), {})
    keys = ("share.record.lock.duration.ms", "share.session.timeout.ms",
            "share.heartbeat.interval.ms", "share.delivery.count.limit")
    return ", ".join(f"`{k}={configs[k]}`" for k in keys if k in configs)


def share_section(details: dict[str, Any], figures: dict[str, FigureJSON],
                  error: str | None = None) -> list[str]:
    """`## Kafka share groups`: the broker and client, each drain, the ratios, the kill
    and the figures."""
    quick = " (BENCH_QUICK smoke run: not for quoting)" if details.get("quick") else ""
    level = details.get("share_version")
    backlogs = details.get("backlogs", {})
    out = [f"## {share_bench.HEADING}", ""]
    out.append(
        f"Measured on {details.get('measured_at')}{quick} in "
        f"{details.get('took_s', 0) / 60:.1f} min on {details.get('nproc')} cores; the "
        f"1-minute load average went from {details.get('load_avg_before', 0):.1f} to "
        f"{details.get('load_avg_after', 0):.1f}. The broker's `share.version` is "
        + (f"finalized at {level}" if level else "**not finalized**")
        + f" (`kafka-features describe`); the client is {details.get('client')}, whose "
        "`ShareConsumer` is a preview. Every contender drains the same backlog of our job "
        f"records on a {details.get('partitions')}-partition topic in processes of its own, "
        "rotating the order: share consumers run our job path (decode, payload, "
        "`JobContext`, async handler, an explicit ACCEPT per record) in a fresh share group; "
        "our worker runs `ordering=\"unordered\"`. No-op backlog: "
        f"{backlogs.get('noop', 0):,} jobs from `enqueue_many`; "
        f"{details.get('sleep_ms')} ms backlog: {backlogs.get('io', 0):,} jobs enqueued one "
        "by one, each consumer running one job at a time and taking "
        f"{share_bench.IO_POLL_RECORDS} records per poll (our worker also at concurrency "
        "64). \"Drain\" runs from the first handler end to the last; \"start to last\" from "
        "the process's start (before the consumer or worker exists); the broker's CPU is "
        "read from /proc over the whole contender, join and close included; the broker is "
        "shared, so \"broker busy just before\" (the 0.5 s before the contender) says how "
        "much of it others may have made (ops/bench/share_groups.py says how).")
    out += [""]
    if details.get("runs"):
        out += [table(RUN_COLUMNS, _run_rows(details["runs"])), ""]
    rows = ratio_rows(figures, share_bench.RATIOS)
    if rows:
        out += [table(RATIO_COLUMNS, rows), ""]
    kills = _kill_rows(details)
    if kills:
        out += [f"A consumer acquires a batch of a {share_bench.REDELIVER_N:,}-job backlog and "
                "is SIGKILLed without acknowledging it while a second consumer of the group "
                "runs (on 2 partitions each consumer is assigned one of its own; on 1 they "
                f"share it); the group has {_group_settings(details)}.", "",
                table(KILL_COLUMNS, kills), ""]
    mine = [f for name, f in figures.items() if name.startswith(share_bench.PREFIX)]
    if mine:
        out += [figures_table(mine), ""]
    out += ["What a `consumption = \"share\"` mode would give and cost: the manual's "
            "Performance page, \"Kafka share groups, measured\" (docs/performance/index.md).",
            ""]
    if error:
        out += [f"**The share run failed**: {error}. The tables hold what was measured "
                "before it failed.", ""]
    return out
