"""The scenarios: what each injects, and how. Each is a fault script run against a live
trial (`trial.Trial`) once a tenth of its jobs are done; the runner then drains and
judges the run the same way for all of them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from ops.chaos import faults
from ops.chaos.faults import FaultError, until
from ops.chaos.net_scenarios import NET_SCENARIOS
from ops.chaos.observe import group_stable
from ops.chaos.scenario import Scenario
from ops.chaos.trial import Inject, Trial

SESSION_TIMEOUT_S = 10.0  # the worker consumer's session_timeout_ms (stream_jobs.runtime.member)


# -- helpers ---------------------------------------------------------------------------


async def stable_with(trial: Trial, members: int, within_s: float = 90.0) -> None:
    await group_stable(trial.settings, trial.policy.job_type, members, within_s)


async def commit_advanced(trial: Trial, within_s: float = 5.0) -> None:
    """Return as soon as the sampler sees the group's committed offsets move (so the next
    action lands right after a commit); give up quietly after `within_s`."""
    samples = trial.commits.samples
    seen = len(samples)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if len(samples) > seen and seen > 0 and samples[-1].offsets != samples[seen - 1].offsets:
            return
        if len(samples) > seen:
            seen = len(samples)
        await asyncio.sleep(0.01)


def spacing(trial: Trial, left: int, *, low: float, high: float) -> float:
    """Seconds to the next fault: spread the `left` faults over the work that remains,
    within [low, high], with some randomness."""
    share = trial.remaining_s(default=high * left) * 0.7 / max(1, left)
    return min(high, max(low, share)) * trial.rng.uniform(0.6, 1.4)


# -- worker faults -------------------------------------------------------------------------


def kill_nine(kills: int = 20, *, low_s: float = 0.5, high_s: float = 4.0) -> Inject:
    """SIGKILL a random worker `kills` times, `low_s`-`high_s` apart; half right after
    the group's committed offsets were seen to move, half at random moments. A
    replacement starts at once."""

    async def inject(trial: Trial) -> None:
        group = trial.workers
        for i in range(kills):
            await asyncio.sleep(spacing(trial, kills - i, low=low_s, high=high_s))
            if i % 2 == 0:
                await commit_advanced(trial)
            victim = trial.rng.choice(group.live())
            at = time.time()
            group.kill(victim)
            trial.fault("kill -9", at, detail=f"{victim.name}", pids=(victim.pid,))
            group.start()

    return inject


def zombie(pause_s: float = 2 * SESSION_TIMEOUT_S) -> Inject:
    """SIGSTOP one worker for twice the session timeout (its partitions go to the others,
    its open transactions hold their row locks), then SIGCONT: its late results and
    commits must not duplicate anything."""

    async def inject(trial: Trial) -> None:
        group = trial.workers
        victim = trial.rng.choice(group.live())
        at = time.time()
        group.pause(victim)
        await stable_with(trial, trial.worker_count - 1, within_s=pause_s * 4)
        await asyncio.sleep(max(0.0, at + pause_s - time.time()))  # the pause itself
        group.resume(victim)
        trial.fault("SIGSTOP worker", at, detail=f"{victim.name} for {pause_s:.0f} s",
                    pids=(victim.pid,))

    return inject


def rolling_restart() -> Inject:
    """SIGTERM each worker in turn, wait for it to exit, start its replacement, and wait
    for the group to settle before the next."""

    async def inject(trial: Trial) -> None:
        group = trial.workers
        await stable_with(trial, trial.worker_count)
        for worker in list(group.live()):
            at = time.time()
            group.terminate(worker)
            rc = await asyncio.to_thread(group.stopped, worker)
            if rc != 0:
                raise FaultError(f"{worker.name} exited with {rc} after SIGTERM\n{worker.tail()}")
            group.start()
            await stable_with(trial, trial.worker_count)
            trial.fault("rolling restart", at, detail=worker.name)

    return inject


def rebalance_storm(changes: int = 12) -> Inject:
    """Every 1-4 s a worker joins or one leaves (SIGTERM), between 1 and 5 members."""

    async def inject(trial: Trial) -> None:
        group = trial.workers
        for _ in range(changes):
            await asyncio.sleep(trial.rng.uniform(1.0, 4.0))
            live = group.live()
            at = time.time()
            if len(live) <= 1 or (len(live) < 5 and trial.rng.random() < 0.5):
                joined = group.start()
                trial.fault("worker joins", at, detail=joined.name)
            else:
                leaving = trial.rng.choice(live)
                group.terminate(leaving)
                trial.fault("worker leaves", at, detail=leaving.name)
        for worker in group.members:
            if not worker.running:
                await asyncio.to_thread(group.stopped, worker)

    return inject


# -- Postgres ------------------------------------------------------------------------------


def postgres_restart() -> Inject:
    async def inject(trial: Trial) -> None:
        at = time.time()
        await faults.stop_postgres(trial.stack.postgres)
        await faults.start_postgres(trial.stack.postgres)
        trial.fault("Postgres restart", at)

    return inject


def postgres_outage(outage_s: float = 30.0) -> Inject:
    """Postgres stopped for `outage_s`: every connection is refused meanwhile."""

    async def inject(trial: Trial) -> None:
        at = time.time()
        await faults.stop_postgres(trial.stack.postgres)
        await asyncio.sleep(max(0.0, at + outage_s - time.time()))  # the outage itself
        await faults.start_postgres(trial.stack.postgres)
        trial.fault("Postgres down", at, detail=f"{outage_s:.0f} s")

    return inject


# -- retry and dead-letter writes ----------------------------------------------------------


def tier_outage(outage_s: float = 20.0) -> Inject:
    """While 5 % of the jobs fail their first attempt, the delay tiers and the DLQ refuse
    writes for `outage_s` (see `faults.refuse_writes`)."""

    async def inject(trial: Trial) -> None:
        prefix = trial.settings.topic_prefix
        specs = [s for s in trial.policy.all_topics(prefix) if s.role in ("tier", "dlq")]
        at = time.time()
        await faults.refuse_writes(trial.settings, specs)
        await asyncio.sleep(max(0.0, at + outage_s - time.time()))  # the outage itself
        await faults.accept_writes(trial.settings, specs)
        trial.fault("tiers refuse writes", at, detail=f"{outage_s:.0f} s")

    return inject


# -- Kafka brokers (3-node cluster) --------------------------------------------------------


def leader_kills(kills: int = 5, down_s: float = 5.0) -> Inject:
    """kill -9 the leader of lane partition 0, keep it down `down_s`, restart it and wait
    until every partition is fully replicated again; `kills` times, chasing the leader."""

    async def inject(trial: Trial) -> None:
        cluster = trial.stack.cluster
        if cluster is None:
            raise FaultError("leader kills need the 3-node cluster")
        topics = [s.name for s in trial.policy.all_topics(trial.settings.topic_prefix)]
        for i in range(kills):
            if i:
                await asyncio.sleep(spacing(trial, kills - i, low=1.0, high=5.0))
            leader = await faults.partition_leader(trial.settings, trial.lane, 0)
            at = time.time()
            await faults.kill_broker(cluster, leader)
            await asyncio.sleep(down_s)  # the time the broker stays down
            await faults.restart_brokers(cluster)
            await until(lambda: faults.fully_replicated(trial.settings, topics, 3), 120,
                        "every partition back in sync")
            trial.fault("kill -9 partition leader", at, detail=f"node {leader}")

    return inject


def broker_pause(pause_s: float = 15.0) -> Inject:
    """SIGSTOP the leader of lane partition 0 for `pause_s` (a long GC pause), SIGCONT."""

    async def inject(trial: Trial) -> None:
        cluster = trial.stack.cluster
        if cluster is None:
            raise FaultError("a broker pause needs the 3-node cluster")
        leader = await faults.partition_leader(trial.settings, trial.lane, 0)
        at = time.time()
        pid = faults.pause_broker(cluster, leader)
        try:
            await asyncio.sleep(pause_s)  # the pause itself
        finally:
            faults.resume_broker(pid)
        trial.fault("SIGSTOP partition leader", at, detail=f"node {leader}, {pause_s:.0f} s")

    return inject


def no_fault() -> Inject:
    async def inject(trial: Trial) -> None:
        return None

    return inject


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("baseline", "no faults",
             "3 workers, no fault: the throughput the recovery times compare with, and the "
             "delivery counts with nothing going wrong.", no_fault(), no_redelivery=True),
    Scenario("kill9", "kill -9 workers, 20 times",
             "A random one of 3 workers is SIGKILLed 20 times, every 0.5-4 s (spread over "
             "the run); every other kill follows a commit the sampler saw land. A "
             "replacement starts at once.", kill_nine(), enqueue_over_s=50.0),
    Scenario("zombie", "SIGSTOP a worker past the session timeout",
             "One of 3 workers is SIGSTOPped for 25 s (session timeout 10 s, handler "
             "timeout 15 s); the group rebalances without it, its open transactions keep "
             "their row locks, and the new owner's runs of its jobs wait on them. Then "
             "SIGCONT: its handlers' timeouts fire at once, and its late results and "
             "commits must not duplicate or lose anything.", zombie(pause_s=25.0),
             handler_timeout_s=15.0, enqueue_over_s=45.0),
    Scenario("leader-kill", "kill -9 the lane partition's leader broker, 5 times",
             "3-node cluster, RF 3, min ISR 2: the leader of lane partition 0 is SIGKILLed, "
             "kept down 5 s, restarted, and the next kill waits until every partition is "
             "back in sync; the kills hit producers as well as consumers.",
             leader_kills(), cluster=True, enqueue_over_s=150.0),
    Scenario("broker-pause", "SIGSTOP the lane partition's leader broker for 15 s",
             "3-node cluster, RF 3, min ISR 2: SIGSTOP, 15 s, SIGCONT.", broker_pause(),
             cluster=True, enqueue_over_s=40.0),
    Scenario("pg-restart", "restart Postgres",
             "`pg_ctl stop -m fast` then start (the stack's own controls), during "
             "processing.", postgres_restart(), enqueue_over_s=20.0),
    Scenario("pg-outage", "Postgres down for 30 s",
             "Postgres stopped for 30 s during processing: every connection is refused.",
             postgres_outage()),
    Scenario("tier-outage", "retry and DLQ writes refused for 20 s",
             "5 % of the jobs fail their first attempt; meanwhile the delay tiers and the "
             "DLQ refuse every write for 20 s (their max.message.bytes set to 16, so "
             "every produce fails with MESSAGE_TOO_LARGE).", tier_outage(),
             fail_fraction=0.05, enqueue_over_s=30.0),
    Scenario("rolling", "rolling clean restart",
             "Each of 3 workers in turn: SIGTERM, wait for its exit, start a new one, wait "
             "for the group to be stable. Goal: 0 duplicate deliveries.", rolling_restart(),
             no_redelivery=True, enqueue_over_s=45.0),
    Scenario("storm", "rebalance storm",
             "12 membership changes 1-4 s apart: a worker joins or one leaves (SIGTERM), "
             "between 1 and 5 members.", rebalance_storm(), enqueue_over_s=45.0),
)} | NET_SCENARIOS


def with_inject(scenario: Scenario, inject: Inject) -> Scenario:
    """The same scenario with a smaller fault script (the CI test's)."""
    return replace(scenario, inject=inject)


__all__ = ["SCENARIOS", "Scenario", "with_inject"]
