"""`make chaos` / `python -m ops.chaos.run`: every scenario and trial, several runs each,
then `ops/chaos/RESULTS.md`.

In this order: the process-fault scenarios on the stack's single broker (`scenarios.py`,
one trial procedure for all: `trial.py`), the trials with procedures of their own
(`TRIALS`: scheduler failover, batch callbacks, cancels racing runs, the outbox through a
Kafka outage, tenants to and from the overflow lane, kept results, the outbox's relays
killed, unique keys raced, the history's counts, the LISTEN connections silenced;
`protocol.py`), then the network scenarios with Toxiproxy in front of the stack's broker
and Postgres (`net_scenarios.py`, `netproxy.py`), then the broker scenarios on a 3-node
cluster started here and stopped afterwards, with the runs there of the trials whose
features write to Kafka (`<name>@cluster`: their own worker kills, plus leader kills,
`leaders.py`); the network stage runs some trials too (`<name>@net`: their workers'
Postgres link blackholed and its connections reset, `pg_link.py`). `stages` decides what
runs where. RESULTS.md is written after every run.

Environment knobs: CHAOS_RUNS (runs of each, default 3), CHAOS_ONLY (comma-separated
names of scenarios and trials, default all), CHAOS_JOBS (jobs per run: DEFAULT_JOBS for
the scenarios, the trials' own sizes for the others; the failover and outbox trials last
a set time whatever it says). The batches, cancels, fairness, failover, results and unique
trials restart the stack's Postgres once a run, as the pg-restart scenario does. The
stack is the one the project's settings name (`stream-jobs dev up` on its ports).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ops.chaos import (
    batches,
    cancels,
    failover,
    fairness,
    history_trial,
    listen_trial,
    outbox,
    relay_trial,
    report,
    results_trial,
    unique_trial,
)
from ops.chaos.netproxy import NetProxy, front
from ops.chaos.protocol import CLUSTER, NETWORK, OwnTrial, TrialRow, elsewhere
from ops.chaos.scenarios import SCENARIOS, Scenario
from ops.chaos.trial import Stack, TrialResult, run_trial
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer

# CHAOS_JOBS=100000 (report.FULL_N, the figure) writes RESULTS-100k.md instead.
DEFAULT_JOBS = 10_000
CHAOS_DIR = Path(__file__).resolve().parent
OUT_DIR = CHAOS_DIR / "out"
OWN_TRIALS = (failover.TRIAL, batches.TRIAL, cancels.TRIAL, outbox.TRIAL, fairness.TRIAL,
              results_trial.TRIAL, relay_trial.TRIAL, unique_trial.TRIAL, history_trial.TRIAL,
              listen_trial.TRIAL)
# Each trial, then its runs in the other stages (`<name>@net`, `<name>@cluster`).
TRIALS: dict[str, OwnTrial] = {t.name: t for t in (
    *OWN_TRIALS, *(elsewhere(t, stage) for stage in (NETWORK, CLUSTER)
                   for t in OWN_TRIALS if stage in t.elsewhere))}

log = logging.getLogger("ops.chaos")


def chosen(only: str) -> tuple[list[Scenario], list[OwnTrial]]:
    """The scenarios and the trials CHAOS_ONLY names (all by default)."""
    if not only.strip():
        return list(SCENARIOS.values()), list(TRIALS.values())
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS and n not in TRIALS]
    if unknown:
        raise SystemExit(f"CHAOS_ONLY names unknown scenarios {unknown}; "
                         f"choose from {', '.join([*SCENARIOS, *TRIALS])}.")
    return ([SCENARIOS[n] for n in names if n in SCENARIOS],
            [t for name, t in TRIALS.items() if name in names])


@dataclass(frozen=True)
class Stages:
    """What runs in each stage of an invocation, in the order the stages run."""

    single: list[Scenario]  # process faults on the stack's single broker
    own: list[OwnTrial]  # the trials, on the single broker
    network: list[Scenario]  # with Toxiproxy in front of the broker and Postgres
    network_trials: list[OwnTrial]  # the trials' runs there
    cluster: list[Scenario]  # on the 3-node cluster
    cluster_trials: list[OwnTrial]  # the trials' runs there


def stages(scenarios: list[Scenario], trials: list[OwnTrial]) -> Stages:
    """The one place that decides which scenario or trial runs in which stage."""
    return Stages(single=[s for s in scenarios if not s.cluster and not s.network],
                  own=[t for t in trials if t.stage not in (NETWORK, CLUSTER)],
                  network=[s for s in scenarios if s.network],
                  network_trials=[t for t in trials if t.stage == NETWORK],
                  cluster=[s for s in scenarios if s.cluster],
                  cluster_trials=[t for t in trials if t.stage == CLUSTER])


@dataclass
class Invocation:
    """What this `make chaos` has run so far, and RESULTS.md written from it."""

    meta: report.MetaJSON
    began: float = field(default_factory=time.time)
    results: list[TrialResult] = field(default_factory=list)
    trials: dict[str, list[TrialRow]] = field(default_factory=dict)

    def write(self) -> None:
        if not self.results and not self.trials:
            return
        self.meta["minutes"] = (time.time() - self.began) / 60
        page, kept = report.files(self.meta["jobs"])
        previous = OUT_DIR / kept
        rows = report.merged(previous, [report.row(r) for r in self.results])
        report.write(CHAOS_DIR / page, rows, self.meta,
                     report.merged_trials(previous, self.trials, list(TRIALS.values())),
                     kept=kept)

    def runs(self) -> int:
        return len(self.results) + sum(len(rows) for rows in self.trials.values())

    def with_problems(self) -> int:
        return (sum(1 for r in self.results if not r.verdict.ok)
                + sum(1 for rows in self.trials.values() for r in rows if not r["ok"]))


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


async def run_own(trial: OwnTrial, stack: Stack, run: int, jobs: int | None) -> TrialRow:
    found = await trial.run(stack, OUT_DIR, run, jobs)
    found["commit"] = report.commit()
    log.info("%s run %d: %s, %.0f s%s", trial.name, run, trial.summary(found),
             found["seconds"], "" if found["ok"] else f" PROBLEMS: {found['problems']}")
    return found


def _meta(jobs: int, runs: int) -> report.MetaJSON:
    return {
        "date": report.today(), "commit": report.commit(), "jobs": jobs, "runs": runs,
        "minutes": 0.0, "machine": report.machine(),
        "n_note": (f"N is {jobs:,} here; the issue's 100,000 is run with "
                   "CHAOS_JOBS=100000 (every scenario once, an hour or more on this "
                   "machine), which writes RESULTS-100k.md beside this file (in the manual: "
                   "Fault injection, Results at 100,000 jobs)."
                   if jobs < report.FULL_N else
                   f"N is {jobs:,}, the issue's figure; the usual runs of 10,000 jobs, "
                   "three of each scenario and trial, are in RESULTS.md beside this file (in "
                   "the manual: Fault injection, Results).")}


async def _single_stack(base: Settings) -> Stack:
    kafka = KafkaCluster(base, 1)
    postgres = PostgresServer(base)
    log.info("starting the stack (single broker and Postgres)")
    await asyncio.to_thread(kafka.up)
    await asyncio.to_thread(postgres.up)
    return Stack(base.model_copy(update={"kafka_bootstrap": kafka.bootstrap,
                                         "database_url": postgres.dsn}), postgres)


async def _on_the_cluster(done: Invocation, base: Settings, single: Stack, plan: Stages,
                          runs: int, jobs: int | None) -> None:
    """The broker scenarios and the trials' runs on a 3-node cluster started here."""
    cluster = KafkaCluster(base, 3)
    log.info("starting the 3-node cluster on %s", cluster.bootstrap)
    await asyncio.to_thread(cluster.up)
    stack = Stack(single.settings.model_copy(update={"kafka_bootstrap": cluster.bootstrap}),
                  single.postgres, cluster)
    try:
        for scenario in plan.cluster:
            for run in range(1, runs + 1):
                done.results.append(await run_scenario(stack, scenario, run,
                                                       jobs or DEFAULT_JOBS))
                done.write()
        await _own_trials(done, stack, plan.cluster_trials, runs, jobs)
    finally:
        await asyncio.to_thread(cluster.down)


async def _own_trials(done: Invocation, stack: Stack, trials: list[OwnTrial], runs: int,
                      jobs: int | None) -> None:
    for trial in trials:
        for run in range(1, runs + 1):
            done.trials.setdefault(trial.name, []).append(
                await run_own(trial, stack, run, jobs))
            done.write()


async def _on_the_network(done: Invocation, single: Stack, plan: Stages, runs: int,
                          jobs: int | None) -> None:
    """The network scenarios and the trials' runs there: Toxiproxy in front of the stack's
    broker and Postgres."""
    proxy = await NetProxy(single.settings.stack_dir, OUT_DIR / "toxiproxy").start()
    try:
        net = await front(proxy, single.settings, KafkaCluster(single.settings, 1))
        stack = replace(single, net=net)
        for scenario in plan.network:
            for run in range(1, runs + 1):
                await proxy.heal()
                result = await run_scenario(stack, scenario, run, jobs or DEFAULT_JOBS)
                done.results.append(result)
                _judge_memory(done.results, scenario, result)
                done.write()
        await proxy.heal()
        await _own_trials(done, stack, plan.network_trials, runs, jobs)
    finally:
        proxy.stop()


def _judge_memory(results: list[TrialResult], scenario: Scenario, result: TrialResult) -> None:
    """A scenario with a memory goal: its workers' peak RSS over the net-baseline's (the
    highest of this invocation's baseline runs)."""
    if scenario.rss_goal is None:
        return
    v = result.verdict
    baseline = [r.verdict.rss_peak_mb for r in results
                if r.scenario == "net-baseline" and r.verdict.rss_peak_mb]
    if v.rss_peak_mb is None or not baseline:
        result.notes.append("no net-baseline run in this invocation: RSS not compared")
        return
    v.rss_ratio = v.rss_peak_mb / max(baseline)
    if v.rss_ratio > scenario.rss_goal:
        v.memory_over_goal = True
        v.problems.append(f"workers' peak RSS {v.rss_peak_mb:.0f} MB is {v.rss_ratio:.2f}x "
                          f"the net-baseline's, over the {scenario.rss_goal}x goal")


async def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    asked = os.environ.get("CHAOS_JOBS", "").strip()
    jobs = int(asked) if asked else None
    runs = int(os.environ.get("CHAOS_RUNS", "3"))
    plan = stages(*chosen(os.environ.get("CHAOS_ONLY", "")))
    n = jobs or DEFAULT_JOBS
    done = Invocation(_meta(n, runs))
    base = Settings()
    single = await _single_stack(base)
    try:
        for scenario in plan.single:
            for run in range(1, runs + 1):
                done.results.append(await run_scenario(single, scenario, run, n))
                done.write()
        await _own_trials(done, single, plan.own, runs, jobs)
        if plan.network or plan.network_trials:
            await _on_the_network(done, single, plan, runs, jobs)
        if plan.cluster or plan.cluster_trials:
            await _on_the_cluster(done, base, single, plan, runs, jobs)
    finally:
        done.write()
    print(f"{done.runs()} runs, {done.with_problems()} with problems; "
          f"see {CHAOS_DIR / report.files(done.meta['jobs'])[0]}")
    return 1 if done.with_problems() else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
