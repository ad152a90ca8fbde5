"""The batch-callback trial: a batch's callbacks run once, after the last member, with the
right counts, while workers are killed with SIGKILL.

    CHAOS_ONLY=batches make chaos                 # 5,000 members, 3 workers, 6 kills
    CHAOS_ONLY=batches CHAOS_JOBS=20000 make chaos

A run gets a fresh prefix and schema. `client.batch` writes the members (through the
outbox, in one transaction) with `on_success` and `on_complete` callbacks; three
`stream-jobs worker ops.chaos.batch_app:app` processes run them (each with its outbox
relay), a fiftieth of the members failing their first attempt. Each time another share
of the members is done a random worker gets SIGKILL and a new one starts; after the
middle kill the stack's Postgres is restarted (`paced.kill_per_share`). Once every
member is done and the callbacks ran, the runner waits until nothing is left to do (the
outbox empty, every lane and tier read to its end by its group), stops the workers, and
`batch_verdict.judge` decides from the tables. `make chaos` runs it (`TRIAL`, the
protocol of ops/chaos/protocol.py); tests/integration/test_batch_faults.py runs it small.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from ops.chaos import paced
from ops.chaos.batch_app import ALBUM, FAIL_EVERY_ENV, HOLD_MS_ENV, MEMBER, TABLES
from ops.chaos.batch_verdict import BatchEvidence, BatchVerdict, CallbackRow, judge
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
from stream_jobs.job_ids import new_job_id
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import declare_type
from stream_jobs.workflows.progress import read_progress

log = logging.getLogger("ops.chaos.batches")
MEMBERS = 5_000
TITLE = "a batch's callbacks through kill -9 and a Postgres restart"
METHOD = ("a batch of 5,000 members (`client.batch`, through the outbox) with `on_success` "
          "and `on_complete` callbacks, on 3 `stream-jobs worker` processes, 2 % of members "
          "failing their first attempt; each time another seventh of the members is done a "
          "random worker gets SIGKILL and a new one starts (6 kills), and the stack's "
          "Postgres is restarted (2 s down) after the third. Judged from the "
          "tables: every member's effect exactly once, each callback's effect exactly once "
          "and later than the last member's, the counts the callbacks saw.")
APP_SPEC = "ops.chaos.batch_app:app"


@dataclass
class BatchTrialResult:
    """One trial: its verdict, what was done to it, how long it took."""

    members: int
    workers: int
    kills: int
    seconds: float
    verdict: BatchVerdict
    notes: list[str] = field(default_factory=list)
    pg_restarts: int = 0
    staged: dict[str, int] = field(default_factory=dict)  # StageFaults.counts

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.notes


async def batch_trial(base: Settings, out_dir: Path, *, members: int = MEMBERS, workers: int = 3,
                      kills: int = 6, fail_every: int = 50, hold_ms: int = 2,
                      within_s: float = 600.0, stack: Stack | None = None,
                      seed: int | None = None) -> BatchTrialResult:
    """One trial against the services `base` names (see the module's docstring); with
    `stack`, restarts its Postgres once on the way, and meets its stage's faults."""
    settings, folder = fresh_settings(base, out_dir, "batches")
    name = settings.topic_prefix
    await prepare_schema(settings, TABLES)
    types = [await declare_type(settings, MEMBER, partitions=6, retry_tiers=["1s"],
                                max_attempts=3, replication_factor=replication(stack)),
             await declare_type(settings, ALBUM, partitions=1, retry_tiers=["1s"],
                                replication_factor=replication(stack))]
    group = WorkerGroup(settings, folder, argv=(str(STREAM_JOBS), "worker", APP_SPEC),
                        env={FAIL_EVERY_ENV: str(fail_every), HOLD_MS_ENV: str(hold_ms),
                             **worker_env(stack)})
    extra = stage_faults(stack, settings, types, kills)
    began = time.monotonic()
    notes: list[str] = []
    member_ids = tuple(new_job_id() for _ in range(members))
    batch_id = ""
    restarts = 0
    try:
        for _ in range(workers):
            group.start()
        batch_id = await App(settings).client().batch(
            [Job(MEMBER, {"n": n}, job_id=job_id) for n, job_id in enumerate(member_ids)],
            on_success=Job(ALBUM, {"kind": "success"}),
            on_complete=Job(ALBUM, {"kind": "complete"}))
        restarts = await paced.kill_per_share(
            group, partial(_done, settings, batch_id), members, kills, within_s,
            random.Random(seed), postgres=stack.postgres if stack else None,
            after=extra.after)
        await until(lambda: _pending_is(settings, batch_id, 0), within_s, "every member done")
        await until(lambda: _callbacks(settings, 2), within_s, "both callbacks")
        await until(lambda: paced.quiet(settings, types), within_s, "nothing left to do")
        for worker in group.live():
            group.terminate(worker)
        for worker in group.members:
            group.stopped(worker)
    except Exception as exc:  # a wait that timed out: judge what there is
        notes.append(f"{type(exc).__name__}: {exc}")
        log.error("batch trial %s: %s\n%s", name, exc, group.tails())
    finally:
        group.close()
    verdict = judge(await _evidence(settings, batch_id, member_ids))
    result = BatchTrialResult(members, workers, len(group.killed),
                              round(time.monotonic() - began, 1), verdict, notes, restarts,
                              extra.counts())
    await settle(settings, folder, [*verdict.problems, *notes])
    if not result.ok:
        log.error("batch trial %s kept its topics and schema for a look: %s", name,
                  verdict.problems + notes)
    return result


async def _done(settings: Settings, batch_id: str) -> int:
    progress = await read_progress(settings, batch_id)
    return progress.succeeded + progress.failed


async def _pending_is(settings: Settings, batch_id: str, pending: int) -> bool:
    return (await read_progress(settings, batch_id)).pending == pending


async def _fetch(settings: Settings, sql: str) -> list[Any]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def _callbacks(settings: Settings, at_least: int) -> bool:
    rows = await _fetch(settings, "SELECT count(*) AS n FROM batch_callback_effects")
    return int(rows[0]["n"]) >= at_least


async def _evidence(settings: Settings, batch_id: str, member_ids: tuple[str, ...]
                    ) -> BatchEvidence:
    effects = await _fetch(settings, "SELECT job_id, count(*) AS n, max(at) AS last "
                                     "FROM batch_member_effects GROUP BY job_id")
    callbacks = await _fetch(settings, "SELECT job_id, kind, payload, at "
                                       "FROM batch_callback_effects")
    runs = await _fetch(settings, "SELECT count(*) AS n FROM batch_callback_runs")
    return BatchEvidence(
        batch_id, member_ids, {r["job_id"]: int(r["n"]) for r in effects},
        max((r["last"] for r in effects), default=None),
        tuple(CallbackRow(r["job_id"], r["kind"], orjson.loads(r["payload"]), r["at"])
              for r in callbacks), int(runs[0]["n"]))


def batch_row(result: BatchTrialResult, run: int, started: float) -> TrialRow:
    """One run as results.json keeps it (what stopped it is a problem too)."""
    v = result.verdict
    return row(run, started, [*v.problems, *result.notes], members=result.members,
               workers=result.workers, kills=result.kills, pg_restarts=result.pg_restarts,
               **result.staged, lost=v.lost,
               duplicate_effects=v.duplicate_effects, callbacks=v.callbacks,
               callback_runs=v.callback_runs)


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    started = time.time()
    result = await batch_trial(stack.settings, out_dir, members=jobs or MEMBERS,
                               stack=stack)
    return batch_row(result, run, started)


def _cells(r: TrialRow) -> list[str]:
    return [f"{r['members']:,}", str(r["workers"]), str(r["kills"]),
            str(r.get("pg_restarts", 0)), str(r["lost"]),
            str(r["duplicate_effects"]), str(r["callbacks"].get("success", 0)),
            str(r["callbacks"].get("complete", 0)), str(r["callback_runs"]),
            f"{r['seconds']:.0f}", "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"{r['members']:,} members, lost {r['lost']}, dup effects "
            f"{r['duplicate_effects']}, callbacks {r['callbacks']}, {r['kills']} kills, "
            f"{r.get('pg_restarts', 0)} Postgres restarts")


TRIAL = OwnTrial(
    "batches", "Batch callbacks", TITLE, METHOD, _run,
    ("members", "workers", "kill -9", "Postgres restarts", "lost", "dup effects", "on_success",
     "on_complete", "callback deliveries", "run s", "ok"), _cells, _summary,
    elsewhere={CLUSTER: LEADER_KILLS, NETWORK: PG_LINK_CUT})
