"""The outbox's relays killed with SIGKILL under transactional enqueues:
`CHAOS_ONLY=outbox-relay make chaos`.

    CHAOS_ONLY=outbox-relay make chaos                # 6,000 jobs, 2 relays, 10 kills
    CHAOS_ONLY=outbox-relay CHAOS_JOBS=10000 make chaos

A run gets a fresh prefix and schema on the stack. Three writers in the runner commit
transactions of 10 jobs through `enqueue_many(conn=...)` (500 jobs/s in all), one
transaction in eight rolled back on purpose after its enqueue. Two `stream-jobs outbox
relay` processes (`--batch 50`) move the rows to Kafka, and two `stream-jobs worker
ops.chaos.relay_app:app` processes, without relays of their own
(`STREAM_JOBS_OUTBOX_RELAY=false`), run the jobs, each effect a row written through
`ctx.once()`. Each time another eleventh of the jobs is committed, a random relay gets
SIGKILL and another starts. Once every committed job has its effect and the outbox is
empty, the processes stop and `relay_verdict.judge` decides from the lane topic and the
tables: every committed job reached Kafka (copies allowed), no rolled-back one did, each
committed job's effect exactly once. `make chaos` runs it (`TRIAL`, the protocol of
ops/chaos/protocol.py); the `outbox` trial is the same outbox through a Kafka outage.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from ops.chaos import paced
from ops.chaos.faults import until
from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.protocol import CLUSTER, NETWORK, OwnTrial, TrialRow, row
from ops.chaos.relay_app import HOLD_MS_ENV, RELAYED_TYPE, TABLES
from ops.chaos.relay_verdict import RelayEvidence, RelayVerdict, judge
from ops.chaos.staged import (
    LEADER_KILLS,
    PG_LINK_CUT,
    replication,
    stage_faults,
    worker_env,
)
from ops.chaos.trial import Stack
from ops.chaos.workers import STREAM_JOBS, WorkerGroup
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.kafka import scan
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.naming import lane_topic
from stream_jobs.outbox.depth import read_depth
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import declare_type

log = logging.getLogger("ops.chaos.relay")
JOBS = 6_000
KILLS = 10
WRITERS = 3
JOBS_PER_S = 500.0
PER_TRANSACTION = 10
ROLL_BACK_EVERY = 8  # one transaction in eight rolls back after its enqueue
RELAY_BATCH = 50
APP_SPEC = "ops.chaos.relay_app:app"
TITLE = "the outbox's relays killed with SIGKILL under transactional enqueues"
METHOD = ("3 writers commit transactions of 10 jobs through `enqueue_many(conn=...)`, 500 "
          "jobs/s in all, one transaction in eight rolled back on purpose after its "
          "enqueue; 2 `stream-jobs outbox relay --batch 50` processes move the rows, and 2 "
          "`stream-jobs worker` processes without relays of their own run the jobs, each "
          "effect written through `ctx.once()`; 6,000 jobs written, and each time another "
          "eleventh of them is committed a random relay gets SIGKILL and another starts (10 "
          "kills). Judged once the outbox is empty and every job ran: every committed job "
          "reached the lane topic (copies from a relay killed between the ack and its "
          "commit allowed, and counted), none of a rolled-back transaction did, each "
          "committed job's effect exactly once.")


class RolledBack(Exception):
    """A writer's transaction that rolls back on purpose."""


@dataclass
class Written:
    """What the writers did, as they did it."""

    committed: set[str] = field(default_factory=set)
    rolled_back: set[str] = field(default_factory=set)


@dataclass
class RelayTrialResult:
    relays: int
    kills: int
    seconds: float
    verdict: RelayVerdict
    rolled_back: int
    notes: list[str] = field(default_factory=list)
    staged: dict[str, int] = field(default_factory=dict)  # StageFaults.counts

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.notes


async def _writer(settings: Settings, first: int, last: int, per_s: float,
                  written: Written) -> None:
    """Commit jobs `first` to `last` - 1, 10 a transaction, `per_s` jobs a second."""
    client = App(settings).client()  # never entered: these writes need no Kafka
    conn = await asyncpg.connect(settings.database_url)
    try:
        due = time.monotonic()
        for n in range(first, last, PER_TRANSACTION):
            jobs = [Job(RELAYED_TYPE, {"n": i}, key=f"k{i % 13}")
                    for i in range(n, min(n + PER_TRANSACTION, last))]
            ids: list[str] = []
            try:
                async with conn.transaction():
                    ids = await client.enqueue_many(jobs, conn=conn)
                    if (n // PER_TRANSACTION) % ROLL_BACK_EVERY == ROLL_BACK_EVERY - 1:
                        raise RolledBack
            except RolledBack:
                written.rolled_back.update(ids)
            else:
                written.committed.update(ids)
            due += len(jobs) / per_s
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # the writers' pace
    finally:
        await conn.close()


async def _write(settings: Settings, jobs: int, written: Written) -> None:
    share = -(-jobs // WRITERS)
    share += -share % PER_TRANSACTION
    async with asyncio.TaskGroup() as writers:
        for w in range(WRITERS):
            writers.create_task(_writer(settings, w * share, min(jobs, (w + 1) * share),
                                        JOBS_PER_S / WRITERS, written))


async def _in_kafka(settings: Settings) -> tuple[str, ...]:
    topic = lane_topic(settings.topic_prefix, RELAYED_TYPE)
    found: list[str] = []
    async with open_reader(settings, client_id="relay-chaos-check") as consumer:
        await consumer.refresh_metadata()
        ranges = await scan.ranges(consumer, topic)
        async for record in scan.scan(consumer, topic, ranges):
            found.extend(v.decode() for k, v in record.headers if k == HEADER_JOB_ID)
    return tuple(found)


async def _drained(settings: Settings, written: Written) -> bool:
    ran = await paced.count(settings, "SELECT count(DISTINCT job_id) FROM relay_effects")
    return ran >= len(written.committed) and not (await read_depth(settings)).depth


async def _evidence(settings: Settings, written: Written) -> RelayEvidence:
    effects = await paced.fetch(settings, "SELECT job_id, count(*) AS n FROM relay_effects "
                                          "GROUP BY job_id")
    return RelayEvidence(frozenset(written.committed), frozenset(written.rolled_back),
                         await _in_kafka(settings), {r["job_id"]: int(r["n"]) for r in effects},
                         (await read_depth(settings)).depth)


async def relay_trial(base: Settings, out_dir: Path, *, jobs: int = JOBS, relays: int = 2,
                      workers: int = 2, kills: int = KILLS, within_s: float = 300.0,
                      seed: int | None = None, stack: Stack | None = None
                      ) -> RelayTrialResult:
    """One trial against the services `base` names (see the module's docstring); with
    `stack`, meets its stage's faults too."""
    settings, folder = fresh_settings(base, out_dir, "outbox-relay",
                                      outbox_sweep_interval_s=1.0)
    rng = random.Random(seed)
    await prepare_schema(settings, TABLES)
    policy = await declare_type(settings, RELAYED_TYPE, partitions=3, retry_tiers=["1s"],
                                replication_factor=replication(stack))
    relay_group = WorkerGroup(settings, folder / "relays", argv=(
        str(STREAM_JOBS), "outbox", "relay", "--batch", str(RELAY_BATCH)),
        env={"STREAM_JOBS_OUTBOX_SWEEP_INTERVAL_S": "1", **worker_env(stack)})
    worker_group = WorkerGroup(settings, folder / "workers",
                               argv=(str(STREAM_JOBS), "worker", APP_SPEC),
                               env={"STREAM_JOBS_OUTBOX_RELAY": "false", HOLD_MS_ENV: "2",
                                    **worker_env(stack)})
    extra = stage_faults(stack, settings, [policy], kills)
    written = Written()
    began = time.monotonic()
    notes: list[str] = []
    try:
        for group, n in ((relay_group, relays), (worker_group, workers)):
            for _ in range(n):
                group.start()

        async def committed() -> int:
            return len(written.committed) + len(written.rolled_back)

        async with asyncio.TaskGroup() as both:  # one failing stops the other
            both.create_task(_write(settings, jobs, written))
            both.create_task(paced.kill_per_share(relay_group, committed, jobs, kills,
                                                  within_s, rng, after=extra.after))
        await until(lambda: _drained(settings, written), within_s,
                    "every committed job run and the outbox empty")
        await paced.stop_all(relay_group)
        await paced.stop_all(worker_group)
    except Exception as exc:  # a wait that timed out: judge what there is
        inner = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
        notes += [f"{type(e).__name__}: {e}" for e in inner]
        log.error("outbox-relay trial %s: %s\n%s\n%s", settings.topic_prefix, exc,
                  relay_group.tails(), worker_group.tails())
    finally:
        relay_group.close()
        worker_group.close()
    verdict = judge(await _evidence(settings, written))
    result = RelayTrialResult(relays, len(relay_group.killed),
                              round(time.monotonic() - began, 1), verdict,
                              len(written.rolled_back), notes, extra.counts())
    await settle(settings, folder, [*verdict.problems, *notes])
    if not result.ok:
        log.error("outbox-relay trial %s kept its topics and schema for a look: %s",
                  settings.topic_prefix, verdict.problems + notes)
    return result


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    started = time.time()
    result = await relay_trial(stack.settings, out_dir, jobs=jobs or JOBS, stack=stack)
    v = result.verdict
    return row(run, started, [*v.problems, *result.notes], committed=v.committed,
               rolled_back=result.rolled_back, relays=result.relays, kills=result.kills,
               **result.staged,
               lost=v.lost, copies_in_kafka=v.copies_in_kafka,
               missing_effects=v.missing_effects, duplicate_effects=v.duplicate_effects)


def _cells(r: TrialRow) -> list[str]:
    return [f"{r['committed']:,}", f"{r['rolled_back']:,}", str(r["kills"]), str(r["lost"]),
            str(r["copies_in_kafka"]), str(r["missing_effects"]),
            str(r["duplicate_effects"]), f"{r['seconds']:.0f}", "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"{r['committed']:,} committed ({r['rolled_back']} rolled back), lost "
            f"{r['lost']}, {r['copies_in_kafka']} copies in Kafka, missing effects "
            f"{r['missing_effects']}, dup effects {r['duplicate_effects']}, "
            f"{r['kills']} relay kills")


TRIAL = OwnTrial(
    "outbox-relay", "The outbox's relays through kill -9", TITLE, METHOD, _run,
    ("committed", "rolled back", "relay kill -9", "lost", "copies in Kafka",
     "missing effects", "dup effects", "run s", "ok"), _cells, _summary,
    elsewhere={CLUSTER: LEADER_KILLS, NETWORK: PG_LINK_CUT})
