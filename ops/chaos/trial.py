"""One run of one scenario: a fresh topic prefix, schema and worker group; N jobs
enqueued while the workers run; the scenario's faults once a tenth of the jobs are done;
then a drain, the evidence, and the verdict."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from ops.chaos import collect
from ops.chaos.app import EFFECTS_TABLE, JOB_TYPE
from ops.chaos.checks import Verdict, judge
from ops.chaos.evidence import Evidence, Fault
from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.netproxy import Fronted
from ops.chaos.observe import Commits, Memory, Throughput, group_stable
from ops.chaos.workers import WorkerGroup
from stream_jobs.client import Job, JobClient
from stream_jobs.errors import StreamJobsError
from stream_jobs.job_ids import new_job_id
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.naming import lane_topic, relay_group, worker_group
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer
from stream_jobs.testing.stack import declare_type

log = logging.getLogger("ops.chaos")

PARTITIONS = 6
# Short tiers and many attempts: a job failing through a 30 s outage is retried, not
# dead-lettered (1 + 5 + 10 x 5 s of delays before the last attempt).
RETRY_TIERS = ["1s", "5s", "10s"]
MAX_ATTEMPTS = 8
ENQUEUE_CHUNK = 1_000
WARM_UP_FRACTION = 0.1


@dataclass(frozen=True)
class Stack:
    """The services a run uses: Postgres always, the 3-node cluster for broker faults."""

    settings: Settings  # bootstrap and database of the stack under test
    postgres: PostgresServer
    cluster: KafkaCluster | None = None
    # Toxiproxy's links in front of the broker and Postgres: the workers go through them
    # (the runner's own clients and checks do not).
    net: Fronted | None = None

    def worker_env(self) -> dict[str, str]:
        """What the workers' environment says differently from the run's settings."""
        if self.net is None:
            return {}
        via = self.net.settings
        return {"STREAM_JOBS_KAFKA_BOOTSTRAP": via.kafka_bootstrap,
                "STREAM_JOBS_DATABASE_URL": via.database_url,
                "STREAM_JOBS_DATABASE_LISTEN_URL": via.listen_url}


class TrialError(Exception):
    """A run could not be carried out (as opposed to a run that found a problem)."""


@dataclass
class Trial:
    """What a scenario's fault script works with."""

    scenario: str
    run: int
    jobs: int
    stack: Stack
    settings: Settings
    policy: JobTypePolicy
    folder: Path
    workers: WorkerGroup
    throughput: Throughput
    commits: Commits
    worker_count: int
    fail_fraction: float = 0.0
    enqueue_over_s: float | None = None
    faults: list[Fault] = field(default_factory=list)
    enqueued: list[str] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)
    enqueue_retries: int = 0
    notes: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)

    @property
    def lane(self) -> str:
        return lane_topic(self.settings.topic_prefix, JOB_TYPE)

    def done(self) -> int:
        """Effect rows so far (the throughput sampler's latest figure)."""
        return self.throughput.latest

    def fault(self, kind: str, started: float, healed: float | None = None, detail: str = "",
              pids: tuple[int, ...] = ()) -> Fault:
        found = Fault(kind, started, time.time() if healed is None else healed, detail, pids)
        self.faults.append(found)
        log.info("%s run %d: %s %s", self.scenario, self.run, kind, detail)
        return found

    def remaining_s(self, default: float) -> float:
        """A guess at the seconds of work left, from the rate over the last 5 s."""
        series = self.throughput.series
        if len(series) < 2:
            return default
        t1, n1 = series[-1]
        t0, n0 = next(((t, n) for t, n in series if t >= t1 - 5), series[0])
        rate = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        return default if rate <= 0 else max(0.0, (self.jobs - n1) / rate)


@dataclass
class TrialResult:
    scenario: str
    run: int
    verdict: Verdict
    seconds: float
    notes: list[str]
    faults: list[Fault]
    started: float = 0.0  # epoch seconds


Inject = Callable[[Trial], Awaitable[None]]


async def run_trial(stack: Stack, *, scenario: str, run: int, jobs: int, inject: Inject,
                    out_dir: Path, workers: int = 3, replication: int = 1,
                    fail_fraction: float = 0.0, handler_timeout_s: float = 30.0,
                    enqueue_over_s: float | None = None, hold_ms: int = 1,
                    drain_timeout_s: float = 600.0) -> TrialResult:
    began = time.time()
    settings, folder = fresh_settings(stack.settings, out_dir, f"{scenario}-{run}")
    prefix = settings.topic_prefix
    await prepare_schema(settings, [collect.SCHEMA_SQL])
    policy = await declare_type(settings, JOB_TYPE, partitions=PARTITIONS,
                                replication_factor=replication, retry_tiers=RETRY_TIERS,
                                max_attempts=MAX_ATTEMPTS)
    group = WorkerGroup(settings, folder, hold_ms=hold_ms, handler_timeout_s=handler_timeout_s,
                        env=stack.worker_env())
    memory = Memory(group)
    trial = Trial(scenario, run, jobs, stack, settings, policy, folder, group,
                  Throughput(settings), Commits(settings, worker_group(prefix, JOB_TYPE),
                                                lane_topic(prefix, JOB_TYPE)),
                  worker_count=workers, fail_fraction=fail_fraction,
                  enqueue_over_s=enqueue_over_s)
    samplers = [asyncio.create_task(trial.throughput.run()),
                asyncio.create_task(trial.commits.run()), asyncio.create_task(memory.run())]
    try:
        for _ in range(workers):
            group.start()
        # Every worker in the group before the first job: faults then hit working members.
        await group_stable(settings, JOB_TYPE, workers, within_s=120)
        log.info("%s run %d: %d workers in the group after %.1f s", scenario, run, workers,
                 time.time() - began)
        enqueuing = asyncio.create_task(_enqueue(trial))
        await _until(lambda: trial.done() >= jobs * WARM_UP_FRACTION or enqueuing.done(),
                     300, f"{WARM_UP_FRACTION:.0%} of the jobs done before the faults", group)
        if enqueuing.done():
            enqueuing.result()  # an enqueue that failed for good ends the run here
        await inject(trial)
        await enqueuing
        for _ in range(workers - len(group.live())):
            group.start()
        drained_at = time.time()
        await _until_drained(trial, drain_timeout_s)
        log.info("%s run %d: faults over in %.1f s, drained %.1f s later", scenario, run,
                 drained_at - began, time.time() - drained_at)
        # Drained means committed to the end: the verdict's evidence is final, so the
        # workers can go without a drain of their own.
        group.close()
        evidence = await _collect(trial, memory.peak_mb)
    finally:
        for task in samplers:
            task.cancel()
        await asyncio.gather(*samplers, return_exceptions=True)
        group.close()
    verdict = judge(evidence)
    await settle(settings, folder, verdict.problems)
    return TrialResult(scenario, run, verdict, time.time() - began, trial.notes, trial.faults,
                       began)


async def _enqueue(trial: Trial) -> None:
    """Enqueue the run's jobs with IDs of our own, so a chunk whose write failed part-way
    (a broker fault) is sent again with the same IDs. With `enqueue_over_s` the chunks
    are spread over that time, so jobs are still being written while faults hit."""
    began = time.monotonic()
    chunks = max(1, -(-trial.jobs // ENQUEUE_CHUNK))
    n_failing = round(trial.jobs * trial.fail_fraction)
    failing = set(trial.rng.sample(range(trial.jobs), n_failing)) if n_failing else set()
    client = JobClient(trial.settings, {JOB_TYPE: trial.policy})
    async with client:
        for start in range(0, trial.jobs, ENQUEUE_CHUNK):
            chunk = []
            for i in range(start, min(start + ENQUEUE_CHUNK, trial.jobs)):
                job_id = new_job_id()
                if i in failing:
                    trial.failing.add(job_id)
                chunk.append(Job(JOB_TYPE, {"n": i, "fail_first": i in failing}, job_id=job_id))
            for attempt in range(1, 31):
                try:
                    await client.enqueue_many(chunk)
                    break
                except StreamJobsError as exc:
                    trial.enqueue_retries += 1
                    log.warning("enqueue of a chunk failed (try %d): %s", attempt, exc)
                    await asyncio.sleep(1.0)  # back off before sending the chunk again
            else:
                raise TrialError("30 tries to enqueue a chunk failed; is Kafka up?")
            trial.enqueued += [str(job.job_id) for job in chunk]
            if trial.enqueue_over_s is not None:
                due = began + trial.enqueue_over_s * (start // ENQUEUE_CHUNK + 1) / chunks
                await asyncio.sleep(max(0.0, due - time.monotonic()))  # the pace


async def _until(check: Callable[[], bool], within_s: float, what: str,
                 group: WorkerGroup) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise TrialError(f"timed out after {within_s:.0f} s waiting for {what}\n"
                             + group.tails())
        await asyncio.sleep(0.1)


async def _until_drained(trial: Trial, within_s: float) -> None:
    """Every job has an effect or a dead letter, and both groups committed to the end."""
    prefix = trial.settings.topic_prefix
    lanes = [trial.lane]
    tiers = list(trial.policy.tier_topics(prefix).values())
    dlq = trial.policy.dlq_topic(prefix)
    deadline = time.monotonic() + within_s
    dead_letters = 0
    dlq_read_at = 0.0
    while True:
        with contextlib.suppress(Exception):
            done = await _distinct_effects(trial.settings)
            if done < trial.jobs and time.monotonic() - dlq_read_at > 5:
                # Dead letters are rare here; counting them costs a consumer, so seldom.
                dlq_read_at = time.monotonic()
                _, dlq_ends = await collect.offsets(trial.settings, None, [dlq])
                dead_letters = sum(dlq_ends.values())
            if done + dead_letters >= trial.jobs:
                committed, ends = await collect.offsets(
                    trial.settings, worker_group(prefix, JOB_TYPE), lanes)
                relayed, tier_ends = await collect.offsets(
                    trial.settings, relay_group(prefix, JOB_TYPE), tiers)
                if (all(committed.get(tp, 0) == end for tp, end in ends.items())
                        and all(relayed.get(tp, 0) == end for tp, end in tier_ends.items())):
                    return
        if time.monotonic() > deadline:
            trial.notes.append(f"not drained within {within_s:.0f} s")
            return
        await asyncio.sleep(0.5)


async def _distinct_effects(settings: Settings) -> int:
    conn = await asyncpg.connect(settings.database_url, timeout=5,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return int(await conn.fetchval(f"SELECT count(DISTINCT job_id) FROM {EFFECTS_TABLE}"))
    finally:
        await conn.close()


async def _collect(trial: Trial, rss_peak_mb: float | None) -> Evidence:
    s = trial.settings
    prefix = s.topic_prefix
    tiers = list(trial.policy.tier_topics(prefix).values())
    committed, ends = await collect.offsets(s, worker_group(prefix, JOB_TYPE), [trial.lane])
    relayed, tier_ends = await collect.offsets(s, relay_group(prefix, JOB_TYPE), tiers)
    forwarded = []
    for tier in tiers:
        forwarded += await collect.forwarded(s, tier, dead_letter=False)
    forwarded += await collect.forwarded(s, trial.policy.dlq_topic(prefix), dead_letter=True)
    return Evidence(
        enqueued=list(trial.enqueued),
        lane=await collect.lane_records(s, trial.lane),
        effects=await collect.effects(s),
        deliveries=collect.deliveries(trial.workers.deliveries_dir),
        forwarded=forwarded,
        commit_samples=list(trial.commits.samples),
        final_committed={p: o for (_, p), o in committed.items()},
        lane_ends={p: o for (_, p), o in ends.items()},
        relay_committed=relayed, tier_ends=tier_ends,
        throughput=list(trial.throughput.series), faults=list(trial.faults),
        expected_failures=set(trial.failing), rss_peak_mb=rss_peak_mb)
