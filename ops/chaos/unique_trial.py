"""Unique keys raced by several producers through kill -9 and a Postgres restart:
`CHAOS_ONLY=unique make chaos`.

    CHAOS_ONLY=unique make chaos                  # 1,500 jobs sent, 3 workers, 6 kills
    CHAOS_ONLY=unique CHAOS_JOBS=5000 make chaos

A run gets a fresh prefix and schema. Four producers in the runner, each with a client of
its own, enqueue `chaos.unique` jobs with `unique_key` (no `unique_for`), each call on a
random one of 32 keys, as fast as the keys let them, so that most calls meet a key
held and race each other for the keys given back. Three `stream-jobs worker
ops.chaos.unique_app:app` processes (their relays moving the jobs from the outbox) run
them, each run holding its key 20 ms. Each time another seventh of the jobs has run, a
random worker gets SIGKILL and another starts, and after the middle kill the stack's
Postgres is restarted (calls that fail meanwhile are made again, on another job ID).
Once enough jobs were sent the producers stop; once everything is run the workers stop,
and `unique_verdict.judge` decides from the calls and the effect rows: no key let two
jobs be pending at once, every job told "sent" ran exactly once, every "not sent" named a
job of its key. `make chaos` runs it (`TRIAL`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.chaos import paced
from ops.chaos.faults import until
from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.protocol import CLUSTER, NETWORK, OwnTrial, TrialRow, row
from ops.chaos.staged import (
    LEADER_KILLS,
    PG_LINK_CUT,
    StageFaults,
    replication,
    stage_faults,
)
from ops.chaos.trial import Stack
from ops.chaos.unique_app import HOLD_MS_ENV, TABLES, UNIQUE_TYPE
from ops.chaos.unique_verdict import Call, EffectRow, UniqueEvidence, UniqueVerdict, judge
from ops.chaos.workers import STREAM_JOBS, WorkerGroup
from stream_jobs.app import App
from stream_jobs.errors import StreamJobsError
from stream_jobs.job_ids import new_job_id
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import declare_type

log = logging.getLogger("ops.chaos.unique")
JOBS = 1_500  # jobs sent (the calls are several times as many)
KILLS = 6
PRODUCERS = 4
KEYS = 32
PAUSE_S = 0.02  # between a producer's calls
APP_SPEC = "ops.chaos.unique_app:app"
TITLE = "unique keys raced by 4 producers through kill -9 and a Postgres restart"
METHOD = ("4 producers, each with a client of its own, enqueue jobs with `unique_key` (no "
          "`unique_for`) on 32 keys, as fast as the keys let them, until 1,500 jobs were "
          "sent; 3 `stream-jobs worker` processes run them (through the outbox, their "
          "relays), each run holding its key 20 ms inside `ctx.once()`; a random worker gets "
          "SIGKILL each time another seventh of the jobs has run (6 kills, another starting "
          "each time) and the stack's Postgres is restarted (2 s down) after the third, "
          "calls failing meanwhile being made again. Judged from every call and effect "
          "row: no key let a second job through while one was pending (each job's certain "
          "time holding its key, from the earlier of its call's return and its run's start "
          "to its effect, never overlaps another's of the key), every job told \"sent\" ran "
          "exactly once, every \"not sent\" ran nothing and named a job of its key, and a "
          "call that failed ran its job at most once. When a finished job's key is given "
          "back is not promised, and not judged.")


@dataclass
class UniqueTrialResult:
    workers: int
    kills: int
    pg_restarts: int
    seconds: float
    verdict: UniqueVerdict
    notes: list[str] = field(default_factory=list)
    staged: dict[str, int] = field(default_factory=dict)  # StageFaults.counts

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.notes


@dataclass
class Race:
    """The producers' calls so far, and when to stop making more."""

    calls: list[Call] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    unclear: list[str] = field(default_factory=list)  # errors that are no StreamJobsError

    def sent(self) -> int:
        return sum(1 for c in self.calls if c.sent)


async def _producer(settings: Settings, producer: int, keys: list[str], rng: random.Random,
                    race: Race) -> None:
    """Enqueue with a random key until `race.stop`; a failed call is kept and the next
    one made after a pause."""
    async with App(settings).client() as client:
        n = 0
        while not race.stop.is_set():
            key, job_id, started = rng.choice(keys), new_job_id(), time.time()
            try:
                answer = await client.enqueue(
                    UNIQUE_TYPE, {"key": key, "producer": producer, "call": n},
                    job_id=job_id, unique_key=key)
            except Exception as exc:  # Postgres restarting: the job may or may not exist
                if not isinstance(exc, StreamJobsError):
                    race.unclear.append(f"{type(exc).__name__}: {exc}")
                race.calls.append(Call(producer, n, key, job_id, started, time.time(),
                                       error=f"{type(exc).__name__}: {exc}"))
                await asyncio.sleep(0.2)  # a caller's pause before trying again
            else:
                race.calls.append(Call(producer, n, key, job_id, started, time.time(),
                                       str(answer), answer.sent))
            n += 1
            await asyncio.sleep(PAUSE_S)


async def _ran(settings: Settings) -> int:
    return await paced.count(settings, "SELECT count(DISTINCT job_id) FROM unique_effects")


async def _evidence(settings: Settings, race: Race) -> UniqueEvidence:
    rows = await paced.fetch(settings, "SELECT job_id, key, started, at FROM unique_effects")
    return UniqueEvidence(tuple(race.calls), tuple(
        EffectRow(r["job_id"], r["key"], r["started"], r["at"]) for r in rows))


async def _race(stack: Stack, settings: Settings, group: WorkerGroup, jobs: int, kills: int,
                rng: random.Random, within_s: float, extra: StageFaults) -> tuple[Race, int]:
    """The producers racing while workers are killed and Postgres restarts, until `jobs`
    were sent and ran: the race, and the number of Postgres restarts."""
    race = Race()
    keys = [f"key-{k}" for k in range(KEYS)]
    producers = [asyncio.create_task(_producer(settings, p, keys, random.Random(rng.random()),
                                               race)) for p in range(PRODUCERS)]
    try:
        restarts = await paced.kill_per_share(group, lambda: _ran(settings), jobs, kills,
                                              within_s, rng, postgres=stack.postgres,
                                              after=extra.after)

        async def enough() -> bool:
            return race.sent() >= jobs

        await until(enough, within_s, f"{jobs} jobs sent")
    finally:
        race.stop.set()
        await asyncio.gather(*producers, return_exceptions=True)
    return race, restarts


async def unique_trial(stack: Stack, out_dir: Path, *, jobs: int = JOBS, workers: int = 3,
                       kills: int = KILLS, hold_ms: int = 20, within_s: float = 300.0,
                       seed: int | None = None) -> UniqueTrialResult:
    """One trial against `stack` (see the module's docstring); restarts its Postgres."""
    settings, folder = fresh_settings(stack.settings, out_dir, "unique")
    rng = random.Random(seed)
    await prepare_schema(settings, TABLES)
    policy = await declare_type(settings, UNIQUE_TYPE, partitions=6, retry_tiers=["1s"],
                                max_attempts=5, replication_factor=replication(stack))
    group = WorkerGroup(settings, folder, argv=(str(STREAM_JOBS), "worker", APP_SPEC),
                        env={HOLD_MS_ENV: str(hold_ms), **stack.worker_env()})
    extra = stage_faults(stack, settings, [policy], kills)
    began = time.monotonic()
    notes: list[str] = []
    race, restarts = Race(), 0
    try:
        for _ in range(workers):
            group.start()
        race, restarts = await _race(stack, settings, group, jobs, kills, rng, within_s,
                                     extra)
        await until(lambda: paced.quiet(settings, [policy]), within_s, "nothing left to do")
        await paced.stop_all(group)
    except Exception as exc:  # a wait that timed out: judge what there is
        notes.append(f"{type(exc).__name__}: {exc}")
        log.error("unique trial %s: %s\n%s", settings.topic_prefix, exc, group.tails())
    finally:
        group.close()
    if race.unclear:
        notes.append(f"{len(race.unclear)} enqueues failed with an error that is no "
                     f"StreamJobsError (e.g. {race.unclear[0]})")
    verdict = judge(await _evidence(settings, race))
    result = UniqueTrialResult(workers, len(group.killed), restarts,
                               round(time.monotonic() - began, 1), verdict, notes,
                               extra.counts())
    await settle(settings, folder, [*verdict.problems, *notes])
    if not result.ok:
        log.error("unique trial %s kept its topics and schema for a look: %s",
                  settings.topic_prefix, verdict.problems + notes)
    return result


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    started = time.time()
    result = await unique_trial(stack, out_dir, jobs=jobs or JOBS)
    v = result.verdict
    return row(run, started, [*v.problems, *result.notes], calls=v.calls, sent=v.sent,
               refused=v.refused, failed=v.failed, sent_unanswered=v.sent_unanswered,
               workers=result.workers, kills=result.kills, pg_restarts=result.pg_restarts,
               **result.staged, lost=v.lost, duplicate_effects=v.duplicate_effects,
               overlaps=v.overlaps)


def _cells(r: TrialRow) -> list[str]:
    return [f"{r['calls']:,}", f"{r['sent']:,}", f"{r['refused']:,}",
            f"{r['failed']} ({r['sent_unanswered']} ran)", str(r["kills"]),
            str(r["pg_restarts"]), str(r["overlaps"]), str(r["lost"]),
            str(r["duplicate_effects"]), f"{r['seconds']:.0f}", "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"{r['calls']:,} calls: {r['sent']:,} sent, {r['refused']:,} refused, "
            f"{r['failed']} failed ({r['sent_unanswered']} of them ran); two pending at once "
            f"{r['overlaps']}, lost {r['lost']}, dup effects {r['duplicate_effects']}, "
            f"{r['kills']} kills, {r['pg_restarts']} Postgres restarts")


TRIAL = OwnTrial(
    "unique", "Unique keys", TITLE, METHOD, _run,
    ("calls", "sent", "refused", "failed (ran anyway)", "kill -9", "Postgres restarts",
     "two pending at once", "lost", "dup effects", "run s", "ok"), _cells, _summary,
    elsewhere={CLUSTER: LEADER_KILLS, NETWORK: PG_LINK_CUT})
