"""Tenants to and from the overflow lane through kill -9: `CHAOS_ONLY=fairness make chaos`.

    CHAOS_ONLY=fairness make chaos                  # 6,000 jobs, 3 workers, 8 kills
    CHAOS_ONLY=fairness CHAOS_JOBS=20000 make chaos

A run gets a fresh prefix and schema. `chaos.fair` (ops/chaos/fair_app.py) is declared
with a `[fairness]` table and runs with `ordering = "key"` on three `stream-jobs worker`
processes. The runner enqueues the jobs in waves (`plan`): in each, a noisy tenant's flood
(four fifths of the wave, in one burst) and then four quiet tenants' jobs, with a pause
between waves; the noisy tenant changes from wave to wave (n0, n1, n0, ...), so tenants
move to the overflow lane and back out of it. Keys are shared across tenants: half of the
jobs take a key from a pool every tenant uses, the others one of their tenant's own; each
job carries its key's sequence number. Meanwhile, each time another ninth of the jobs has
its effect, a random worker gets SIGKILL and another starts, and after the middle kill
the stack's Postgres is restarted (`paced.kill_per_share`). Once every job has its effect
and the lanes (the overflow lane too) and tiers are read to their ends, the workers stop and
`fair_verdict.judge` decides: none lost, no effect twice, each key's effects in its
sequence order, and some jobs through the overflow lane. `make chaos` runs it (`TRIAL`);
tests/integration/test_fair_faults.py runs it small.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import asyncpg

from ops.chaos import collect, paced
from ops.chaos.fair_app import FAIR_TYPE, HOLD_MS_ENV, TABLES
from ops.chaos.fair_verdict import EffectRow, FairEvidence, FairVerdict, Planned, judge
from ops.chaos.faults import until
from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.protocol import CLUSTER, NETWORK, OwnTrial, TrialRow, row
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
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import open_admin
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import overflow_topic, relay_group, worker_group
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings

log = logging.getLogger("ops.chaos.fairness")
JOBS = 6_000
KILLS = 8
WAVES = 6
QUIET = ("q0", "q1", "q2", "q3")
SHARED_KEYS = 16
OWN_KEYS = 8
SEND_BATCH = 200
APP_SPEC = "ops.chaos.fair_app:app"
# The type's TOML: a short noisy window, so a tenant is quiet again soon after its flood.
TOML = ('partitions = 6\nreplication_factor = {replication}\nretry_tiers = ["1s"]\n'
        'max_attempts = 3\n\n[fairness]\nnoisy_window = "2s"\n')
TITLE = "tenants to and from the overflow lane through kill -9 and a Postgres restart"
METHOD = ("a type with `[fairness]` and `ordering = \"key\"` on 3 `stream-jobs worker` "
          "processes; 6,000 jobs in 6 waves, each a noisy tenant's burst (4/5 of the wave) "
          "then 4 quiet tenants' jobs, 2 s apart, the noisy tenant alternating (n0, n1), so "
          "tenants move to the overflow lane and back; half the keys shared across tenants, "
          "each job carrying its key's sequence number; a random worker gets SIGKILL each "
          "time another ninth of the jobs is done (8 kills, another starting each time), and "
          "the stack's Postgres is restarted (2 s down) after the fourth. "
          "Judged once drained: no job lost, no effect twice (through `ctx.once()`), each "
          "key's first effects in its sequence order (those of jobs that succeeded first "
          "time: a job failing while Postgres restarts leaves for a delay tier, and a "
          "retried job may run after later jobs of its key, as docs/design says; a job "
          "with a record in a delay tier counts as retried even when a copy of its first "
          "attempt, read again after a kill, wrote its effect), and jobs through the "
          "overflow lane (else the run proved nothing).")


def plan(jobs: int, waves: int, rng: random.Random) -> list[list[Planned]]:
    """The jobs, wave by wave, in the order they are enqueued (see the module)."""
    seqs: Counter[str] = Counter()
    out: list[list[Planned]] = []
    per_wave = math.ceil(jobs / waves)
    for wave in range(waves):
        size = max(0, min(per_wave, jobs - wave * per_wave))
        flood = size * 4 // 5
        tenants = [f"n{wave % 2}"] * flood + [QUIET[i % len(QUIET)]
                                               for i in range(size - flood)]
        planned = []
        for tenant in tenants:
            key = (f"s{rng.randrange(SHARED_KEYS)}" if rng.random() < 0.5
                   else f"{tenant}-k{rng.randrange(OWN_KEYS)}")
            seqs[key] += 1
            planned.append(Planned(tenant, key, seqs[key]))
        out.append(planned)
    return out


@dataclass
class FairTrialResult:
    """One trial: its verdict, what was done to it, how long it took."""

    workers: int
    kills: int
    seconds: float
    verdict: FairVerdict
    notes: list[str] = field(default_factory=list)
    pg_restarts: int = 0
    staged: dict[str, int] = field(default_factory=dict)  # StageFaults.counts

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.notes


async def _declare(settings: Settings, replication: int) -> JobTypePolicy:
    (settings.topics_dir / f"{FAIR_TYPE}.toml").write_text(TOML.format(replication=replication))
    types = load_job_types(settings.topics_dir)
    await apply(settings, types)
    return types[FAIR_TYPE]


async def _enqueue(settings: Settings, waves: list[list[Planned]], pause_s: float,
                   enqueued: dict[str, Planned]) -> None:
    """Each wave in batches, each job in its tenant's name and keyed by its key, then a
    pause; `enqueued` fills as the broker acknowledges."""
    async with App(settings).client() as client:
        for wave in waves:
            for first in range(0, len(wave), SEND_BATCH):
                chunk = wave[first:first + SEND_BATCH]
                ids = await client.enqueue_many(
                    Job(FAIR_TYPE, {"tenant": p.tenant, "key": p.key, "seq": p.seq},
                        key=p.key, tenant=p.tenant) for p in chunk)
                enqueued.update(zip(ids, chunk, strict=True))
            await asyncio.sleep(pause_s)


async def _fetch(settings: Settings, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def _done_at_least(settings: Settings, target: int) -> bool:
    return await _done(settings) >= target


async def _done(settings: Settings) -> int:
    rows = await _fetch(settings, "SELECT count(DISTINCT job_id) AS n FROM fair_effects")
    return int(rows[0]["n"])


async def _read_to_the_end(settings: Settings, policy: JobTypePolicy) -> bool:
    """Every lane, the overflow lane and every tier of the type is read to its end by
    its group (the workers read the overflow lane in the lanes' group)."""
    prefix = settings.topic_prefix
    lanes = [*policy.lane_topics(prefix).values(), overflow_topic(prefix, policy.job_type)]
    async with open_reader(settings) as reader, open_admin(settings) as admin:
        for group, topics in ((worker_group(prefix, policy.job_type), lanes),
                              (relay_group(prefix, policy.job_type),
                               list(policy.tier_topics(prefix).values()))):
            tps = [TopicPartition(t, p) for t in topics for p in range(policy.partitions)]
            ends = await reader.end_offsets(tps)
            committed = await admin.committed_offsets(group, tps)
            if any(end > (committed.get(tp) or 0) for tp, end in ends.items()):
                return False
    return True


async def _evidence(settings: Settings, policy: JobTypePolicy,
                    enqueued: dict[str, Planned]) -> FairEvidence:
    prefix = settings.topic_prefix
    rows = await _fetch(settings, "SELECT job_id, key, seq, extract(epoch FROM at)::float8 "
                                  "AS at, attempt FROM fair_effects")
    _, ends = await collect.offsets(settings, None, [overflow_topic(prefix, FAIR_TYPE)])
    delayed: set[str] = set()
    for topic in (*policy.tier_topics(prefix).values(), policy.dlq_topic(prefix)):
        delayed.update(f.job_id for f in await collect.forwarded(settings, topic,
                                                                 dead_letter=False))
    return FairEvidence(dict(enqueued),
                        tuple(EffectRow(r["job_id"], r["key"], r["seq"], r["at"],
                                        r["attempt"]) for r in rows), sum(ends.values()),
                        frozenset(delayed))


async def fair_trial(base: Settings, out_dir: Path, *, jobs: int = JOBS, workers: int = 3,
                     kills: int = KILLS, waves: int = WAVES, pause_s: float = 2.0,
                     hold_ms: int = 2, within_s: float = 600.0,
                     seed: int | None = None, stack: Stack | None = None) -> FairTrialResult:
    """One trial against the services `base` names (see the module's docstring); with
    `stack`, restarts its Postgres once on the way, and meets its stage's faults."""
    settings, folder = fresh_settings(base, out_dir, "fairness")
    rng = random.Random(seed)
    await prepare_schema(settings, TABLES)
    policy = await _declare(settings, replication(stack))
    group = WorkerGroup(settings, folder, argv=(str(STREAM_JOBS), "worker", APP_SPEC,
                                                "--type", FAIR_TYPE),
                        env={HOLD_MS_ENV: str(hold_ms), **worker_env(stack)})
    extra = stage_faults(stack, settings, [policy], kills)
    began = time.monotonic()
    notes: list[str] = []
    enqueued: dict[str, Planned] = {}
    restarts = 0
    try:
        for _ in range(workers):
            group.start()
        async with asyncio.TaskGroup() as both:  # one failing stops the other
            both.create_task(_enqueue(settings, plan(jobs, waves, rng), pause_s, enqueued))
            killing = both.create_task(paced.kill_per_share(
                group, partial(_done, settings), jobs, kills, within_s, rng,
                postgres=stack.postgres if stack else None, after=extra.after))
        restarts = killing.result()
        await until(partial(_done_at_least, settings, jobs), within_s, "every job done")
        await until(partial(_read_to_the_end, settings, policy), within_s,
                    "the lanes and tiers read to their ends")
        for worker in group.live():
            group.terminate(worker)
        for worker in group.members:
            group.stopped(worker)
    except Exception as exc:  # a wait that timed out: judge what there is
        inner = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
        notes += [f"{type(e).__name__}: {e}" for e in inner]
        log.error("fairness trial %s: %s\n%s", settings.topic_prefix, exc, group.tails())
    finally:
        group.close()
    verdict = judge(await _evidence(settings, policy, enqueued))
    result = FairTrialResult(workers, len(group.killed), round(time.monotonic() - began, 1),
                             verdict, notes, restarts, extra.counts())
    await settle(settings, folder, [*verdict.problems, *notes])
    if not result.ok:
        log.error("fairness trial %s kept its topics and schema for a look: %s",
                  settings.topic_prefix, verdict.problems + notes)
    return result


def fair_row(result: FairTrialResult, run: int, started: float) -> TrialRow:
    """One run as results.json keeps it (what stopped it is a problem too)."""
    v = result.verdict
    return row(run, started, [*v.problems, *result.notes], jobs=v.jobs,
               workers=result.workers, kills=result.kills, pg_restarts=result.pg_restarts,
               **result.staged, lost=v.lost,
               duplicate_effects=v.duplicate_effects, keys_out_of_order=v.keys_out_of_order,
               retried=v.retried,
               overflowed=v.overflowed)


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    started = time.time()
    result = await fair_trial(stack.settings, out_dir, jobs=jobs or JOBS,
                              stack=stack)
    return fair_row(result, run, started)


def _cells(r: TrialRow) -> list[str]:
    return [f"{r['jobs']:,}", str(r["workers"]), str(r["kills"]),
            str(r.get("pg_restarts", 0)), str(r["lost"]),
            str(r["duplicate_effects"]), str(r["keys_out_of_order"]),
            f"{r.get('retried', 0):,}",
            f"{r['overflowed']:,}", f"{r['seconds']:.0f}", "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"{r['jobs']:,} jobs, lost {r['lost']}, dup effects {r['duplicate_effects']}, "
            f"keys out of order {r['keys_out_of_order']}, {r['overflowed']:,} through the "
            f"overflow, {r['kills']} kills, {r.get('pg_restarts', 0)} Postgres restarts")


TRIAL = OwnTrial(
    "fairness", "Fair queues", TITLE, METHOD, _run,
    ("jobs", "workers", "kill -9", "Postgres restarts", "lost", "dup effects",
     "keys out of order", "retried (order not promised)", "through the overflow", "run s",
     "ok"), _cells, _summary, elsewhere={CLUSTER: LEADER_KILLS, NETWORK: PG_LINK_CUT})
