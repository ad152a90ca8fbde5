"""`make chaos` / `python -m ops.chaos.run`: every scenario, several runs each, then
`ops/chaos/RESULTS.md`.

Environment knobs: CHAOS_JOBS (jobs per run, default DEFAULT_JOBS), CHAOS_RUNS (runs per
scenario, default 3), CHAOS_ONLY (comma-separated scenario names, default all). The stack
is the one the project's settings name (`stream-jobs dev up` on its ports); the 3-node
cluster for the broker scenarios is started here and stopped afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from ops.chaos import batches, failover, report
from ops.chaos.scenarios import SCENARIOS, Scenario
from ops.chaos.trial import Stack, TrialResult, run_trial
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer

# 100,000 (the figure) would take about 2 h here: see RESULTS.md.
DEFAULT_JOBS = 10_000
CHAOS_DIR = Path(__file__).resolve().parent
OUT_DIR = CHAOS_DIR / "out"

log = logging.getLogger("ops.chaos")


_OWN = (failover.SCENARIO, batches.SCENARIO)  # scenarios with trials of their own


def chosen(only: str) -> tuple[list[Scenario], set[str]]:
    """The job scenarios CHAOS_ONLY names (all by default), and which of the scenarios
    with trials of their own (scheduler failover, batch callbacks) are among them."""
    if not only.strip():
        return list(SCENARIOS.values()), set(_OWN)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS and n not in _OWN]
    if unknown:
        raise SystemExit(f"CHAOS_ONLY names unknown scenarios {unknown}; "
                         f"choose from {', '.join([*SCENARIOS, *_OWN])}.")
    return [SCENARIOS[n] for n in names if n in SCENARIOS], {n for n in names if n in _OWN}


async def run_scenario(stack: Stack, scenario: Scenario, run: int, jobs: int) -> TrialResult:
    result = await run_trial(
        stack, scenario=scenario.name, run=run, jobs=jobs, inject=scenario.inject,
        out_dir=OUT_DIR, workers=scenario.workers,
        replication=3 if scenario.cluster else 1, fail_fraction=scenario.fail_fraction,
        handler_timeout_s=scenario.handler_timeout_s, enqueue_over_s=scenario.enqueue_over_s)
    v = result.verdict
    if scenario.no_redelivery and v.duplicate_deliveries:
        result.notes.append(f"{v.duplicate_deliveries} duplicate deliveries where the goal "
                            "is 0")
    log.info("%s run %d: lost %d, dup effects %d, dup deliveries %d, %.0f s%s",
             scenario.name, run, v.lost, v.duplicate_effects, v.duplicate_deliveries,
             result.seconds, "" if v.ok else f" PROBLEMS: {v.problems}")
    return result


async def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    jobs = int(os.environ.get("CHAOS_JOBS", DEFAULT_JOBS))
    runs = int(os.environ.get("CHAOS_RUNS", "3"))
    scenarios, own = chosen(os.environ.get("CHAOS_ONLY", ""))
    began = time.time()
    base = Settings()
    kafka = KafkaCluster(base, 1)
    postgres = PostgresServer(base)
    log.info("starting the stack (single broker and Postgres)")
    await asyncio.to_thread(kafka.up)
    await asyncio.to_thread(postgres.up)
    single = Stack(base.model_copy(update={"kafka_bootstrap": kafka.bootstrap,
                                           "database_url": postgres.dsn}), postgres)
    results: list[TrialResult] = []
    failovers: list[report.FailoverRowJSON] = []
    batch_rows: list[dict[str, Any]] = []
    meta: report.MetaJSON = {
        "date": report.today(), "commit": report.commit(), "jobs": jobs, "runs": runs,
        "minutes": 0.0,
        "machine": report.machine(),
        "n_note": (f"N is {jobs:,}, not the issue's 100,000. Most of a run's time is "
                   "its faults (20 kills, a 30 s outage, five broker restarts), not its "
                   "jobs, but a run still processes its N with exactly-once effects at "
                   "a few hundred to ~1,000 jobs/s here, and at 100,000 the full run "
                   "(10 scenarios x 3 runs) would take about 2 hours on this shared "
                   "2-core machine instead of the ~35 minutes asked for. "
                   "CHAOS_JOBS=100000 runs it at the issue's N."
                   if jobs < 100_000 else "")}
    plain = [s for s in scenarios if not s.cluster]
    clustered = [s for s in scenarios if s.cluster]
    try:
        for scenario in plain:
            for run in range(1, runs + 1):
                results.append(await run_scenario(single, scenario, run, jobs))
                _write(results, meta, began, failovers, batch_rows)
        for run in range(1, runs + 1 if failover.SCENARIO in own else 1):
            failovers.append(await run_failover_scenario(single, run))
            _write(results, meta, began, failovers, batch_rows)
        for run in range(1, runs + 1 if batches.SCENARIO in own else 1):
            batch_rows.append(await run_batch_scenario(single, run))
            _write(results, meta, began, failovers, batch_rows)
        if clustered:
            cluster = KafkaCluster(base, 3)
            log.info("starting the 3-node cluster on %s", cluster.bootstrap)
            await asyncio.to_thread(cluster.up)
            stack = Stack(single.settings.model_copy(
                update={"kafka_bootstrap": cluster.bootstrap}), postgres, cluster)
            try:
                for scenario in clustered:
                    for run in range(1, runs + 1):
                        results.append(await run_scenario(stack, scenario, run, jobs))
                        _write(results, meta, began, failovers, batch_rows)
            finally:
                await asyncio.to_thread(cluster.down)
    finally:
        _write(results, meta, began, failovers, batch_rows)
    bad = ([r for r in results if not r.verdict.ok] + [f for f in failovers if not f["ok"]]
           + [b for b in batch_rows if not b["ok"]])
    total = len(results) + len(failovers) + len(batch_rows)
    print(f"{total} runs, {len(bad)} with problems; see {CHAOS_DIR / 'RESULTS.md'}")
    return 1 if bad else 0


async def run_failover_scenario(stack: Stack, run: int) -> report.FailoverRowJSON:
    result = await failover.run_failover(stack.settings, OUT_DIR, run=run)
    row = report.failover_row(result)
    log.info("%s run %d: missed %d, dup effects %d, takeovers %s, gaps %s, %.0f s%s",
             failover.SCENARIO, run, row["missed"], row["duplicate_effects"],
             row["takeovers_s"], [round(g, 2) for g in row["gaps_s"]], row["seconds"],
             "" if row["ok"] else f" PROBLEMS: {row['problems']}")
    return row


async def run_batch_scenario(stack: Stack, run: int) -> dict[str, Any]:
    result = await batches.batch_trial(stack.settings, OUT_DIR / "batch")
    v = result.verdict
    log.info("%s run %d: lost %d, dup effects %d, callbacks %s, %d kills, %.0f s%s",
             batches.SCENARIO, run, v.lost, v.duplicate_effects, v.callbacks, result.kills,
             result.seconds, "" if result.ok else f" PROBLEMS: {v.problems + result.notes}")
    return batches.batch_row(result, run)


def _write(results: list[TrialResult], meta: report.MetaJSON, began: float,
           failovers: list[report.FailoverRowJSON], batch_rows: list[dict[str, Any]]) -> None:
    if not results and not failovers and not batch_rows:
        return
    meta["minutes"] = (time.time() - began) / 60
    rows = report.merged(OUT_DIR / "results.json", [report.row(r) for r in results])
    report.write(CHAOS_DIR / "RESULTS.md", rows, meta,
                 report.merged_failover(OUT_DIR / "results.json", failovers),
                 report.merged_batch(OUT_DIR / "results.json", batch_rows))


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
