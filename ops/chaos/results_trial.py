"""Kept results through kill -9 and a Postgres restart: `CHAOS_ONLY=results make chaos`.

    CHAOS_ONLY=results make chaos                 # 3,000 jobs, 3 workers, 8 kills
    CHAOS_ONLY=results CHAOS_JOBS=10000 make chaos

A run gets a fresh prefix and schema. `chaos.result` (ops/chaos/results_app.py) keeps
what its handler returns, a value computed from the payload, its effect written through
`ctx.once()`, `ctx.once_deferred()` or neither by the job's number. Three `stream-jobs
worker` processes run it. The runner enqueues the jobs, and clients wait with
`client.result()` for a random sample of them, asking again after a `ResultTimeout` or a
`DatabaseUnavailable`; meanwhile, each time another ninth of the jobs has its result, a
random worker gets SIGKILL and another starts, and after the middle kill the stack's
Postgres is restarted. Once every job has its result and every waiter its answer, the
workers stop and `results_verdict.judge` decides: every kept result is the handler's
return value for the job's payload, every waiter got it, none lost, no effect twice.
`make chaos` runs it (`TRIAL`, the protocol of ops/chaos/protocol.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import orjson

from ops.chaos import paced
from ops.chaos.faults import until
from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.protocol import CLUSTER, NETWORK, OwnTrial, TrialRow, row
from ops.chaos.results_app import HOLD_MS_ENV, RESULT_TYPE, TABLES, form_of, make_app, result_for
from ops.chaos.results_verdict import KeptRow, ResultsEvidence, ResultsVerdict, WaitRow, judge
from ops.chaos.staged import (
    LEADER_KILLS,
    PG_LINK_CUT,
    StageFaults,
    replication,
    stage_faults,
)
from ops.chaos.trial import Stack
from ops.chaos.workers import STREAM_JOBS, WorkerGroup
from stream_jobs.client import Job, JobClient
from stream_jobs.errors import DatabaseUnavailable, ResultTimeout
from stream_jobs.job_ids import new_job_id
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.stack import PostgresServer
from stream_jobs.testing.stack import declare_type

log = logging.getLogger("ops.chaos.results")
JOBS = 3_000
KILLS = 8
WAITERS = 200
WAIT_S = 5.0  # each `client.result` call's timeout: several per waiter during the faults
SEND_BATCH = 500
APP_SPEC = "ops.chaos.results_app:app"
TITLE = "kept results through kill -9 and a Postgres restart"
METHOD = ("a type with `keep_result` whose handler returns a value computed from its "
          "payload (a third of the jobs write their effect through `ctx.once()`, held open "
          "3 ms, a third through `ctx.once_deferred()`, a third neither), on 3 `stream-jobs "
          "worker` processes; 3,000 jobs, and 200 clients waiting with `client.result()` "
          "(5 s timeouts) for a random sample of them, asking again after a `ResultTimeout` "
          "or `DatabaseUnavailable`; a random worker gets SIGKILL each time another ninth "
          "of the jobs has its result (8 kills, another starting each time) and the "
          "stack's Postgres is restarted (2 s down) after the fourth. Judged: every job's "
          "kept result equals the handler's return value for its payload (none lost, none "
          "wrong), every waiter got that value and saw no other error, each effect exactly "
          "once (none for the jobs that write none).")


@dataclass
class ResultsTrialResult:
    workers: int
    kills: int
    pg_restarts: int
    seconds: float
    verdict: ResultsVerdict
    notes: list[str] = field(default_factory=list)
    staged: dict[str, int] = field(default_factory=dict)  # StageFaults.counts

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.notes


async def _wait_for(client: JobClient, job_id: str, within_s: float) -> WaitRow:
    """Ask for the job's result until it comes or `within_s` passes, as a caller would:
    again after each timeout or unavailable database; other errors are kept."""
    deadline = time.monotonic() + within_s
    timeouts = unavailable = 0
    errors: list[str] = []
    while time.monotonic() < deadline:
        try:
            value = await client.result(job_id, timeout=WAIT_S)
        except ResultTimeout:
            timeouts += 1
        except DatabaseUnavailable:
            unavailable += 1
            await asyncio.sleep(0.5)  # a caller's pause before asking again
        except Exception as exc:  # unclear to a caller: kept for the verdict
            log.warning("result(%s) raised %s", job_id, type(exc).__name__, exc_info=True)
            errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.5)
        else:
            return WaitRow(job_id, True, value, timeouts, unavailable, tuple(errors))
    return WaitRow(job_id, False, None, timeouts, unavailable, tuple(errors))


async def _kept_count(settings: Settings) -> int:
    return await paced.count(settings, "SELECT count(*) FROM stream_jobs_results")


async def _drive(settings: Settings, group: WorkerGroup, planned: dict[str, int],
                 postgres: PostgresServer, kills: int, rng: random.Random,
                 within_s: float, extra: StageFaults) -> tuple[list[WaitRow], int]:
    """Enqueue, wait for a sample, kill and restart along the way: the waits, and the
    number of Postgres restarts."""
    jobs = [Job(RESULT_TYPE, {"n": n}, job_id=job_id) for job_id, n in planned.items()]
    sample = rng.sample(list(planned), min(WAITERS, len(planned)))
    async with make_app(settings).client() as client:
        for first in range(0, len(jobs), SEND_BATCH):
            await client.enqueue_many(jobs[first:first + SEND_BATCH])
        waiting = [asyncio.create_task(_wait_for(client, job_id, within_s))
                   for job_id in sample]
        try:
            restarts = await paced.kill_per_share(group, partial(_kept_count, settings),
                                                  len(planned), kills, within_s, rng,
                                                  postgres=postgres, after=extra.after)
            waits = list(await asyncio.gather(*waiting))
        finally:  # a fault that could not be made: no waiter outlives the client
            for task in waiting:
                task.cancel()
    return waits, restarts


async def _evidence(settings: Settings, planned: dict[str, int],
                    waits: list[WaitRow]) -> ResultsEvidence:
    kept = await paced.fetch(settings, "SELECT job_id, state, result::text AS result "
                                       "FROM stream_jobs_results")
    effects = await paced.fetch(settings, "SELECT job_id, count(*) AS n FROM result_effects "
                                          "GROUP BY job_id")
    return ResultsEvidence(
        {job_id: result_for(n) for job_id, n in planned.items()},
        frozenset(j for j, n in planned.items() if form_of(n) != "neither"),
        {r["job_id"]: KeptRow(r["state"], None if r["result"] is None
                              else orjson.loads(r["result"])) for r in kept},
        {r["job_id"]: int(r["n"]) for r in effects}, tuple(waits))


async def results_trial(stack: Stack, out_dir: Path, *, jobs: int = JOBS, workers: int = 3,
                        kills: int = KILLS, hold_ms: int = 3, within_s: float = 300.0,
                        seed: int | None = None) -> ResultsTrialResult:
    """One trial against `stack` (see the module's docstring); restarts its Postgres."""
    settings, folder = fresh_settings(stack.settings, out_dir, "results")
    rng = random.Random(seed)
    await prepare_schema(settings, TABLES)
    policy = await declare_type(settings, RESULT_TYPE, partitions=6, retry_tiers=["1s"],
                                max_attempts=5, replication_factor=replication(stack))
    group = WorkerGroup(settings, folder, argv=(str(STREAM_JOBS), "worker", APP_SPEC),
                        env={HOLD_MS_ENV: str(hold_ms), **stack.worker_env()})
    extra = stage_faults(stack, settings, [policy], kills)
    planned = {new_job_id(): n for n in range(jobs)}
    began = time.monotonic()
    notes: list[str] = []
    waits: list[WaitRow] = []
    restarts = 0
    try:
        for _ in range(workers):
            group.start()
        waits, restarts = await _drive(settings, group, planned, stack.postgres, kills, rng,
                                       within_s, extra)
        await until(lambda: _all_kept(settings, jobs), within_s, "every job's result")
        await paced.stop_all(group)
    except Exception as exc:  # a wait that timed out: judge what there is
        notes.append(f"{type(exc).__name__}: {exc}")
        log.error("results trial %s: %s\n%s", settings.topic_prefix, exc, group.tails())
    finally:
        group.close()
    verdict = judge(await _evidence(settings, planned, waits))
    result = ResultsTrialResult(workers, len(group.killed), restarts,
                                round(time.monotonic() - began, 1), verdict, notes,
                                extra.counts())
    await settle(settings, folder, [*verdict.problems, *notes])
    if not result.ok:
        log.error("results trial %s kept its topics and schema for a look: %s",
                  settings.topic_prefix, verdict.problems + notes)
    return result


async def _all_kept(settings: Settings, jobs: int) -> bool:
    return await _kept_count(settings) >= jobs


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    started = time.time()
    result = await results_trial(stack, out_dir, jobs=jobs or JOBS)
    v = result.verdict
    return row(run, started, [*v.problems, *result.notes], jobs=v.jobs,
               workers=result.workers, kills=result.kills, pg_restarts=result.pg_restarts,
               **result.staged, lost=v.lost, wrong=v.wrong, duplicate_effects=v.duplicate_effects,
               waited=v.waited, answered=v.waits_answered, timeouts=v.timeouts_retried,
               unavailable=v.unavailable_retried)


def _cells(r: TrialRow) -> list[str]:
    return [f"{r['jobs']:,}", str(r["kills"]), str(r["pg_restarts"]), str(r["lost"]),
            str(r["wrong"]), str(r["duplicate_effects"]), f"{r['answered']}/{r['waited']}",
            str(r["timeouts"]), str(r["unavailable"]), f"{r['seconds']:.0f}",
            "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"{r['jobs']:,} jobs, lost {r['lost']}, wrong {r['wrong']}, dup effects "
            f"{r['duplicate_effects']}, waiters answered {r['answered']}/{r['waited']} "
            f"({r['timeouts']} timeouts, {r['unavailable']} unavailable, retried), "
            f"{r['kills']} kills, {r['pg_restarts']} Postgres restarts")


TRIAL = OwnTrial(
    "results", "Kept results", TITLE, METHOD, _run,
    ("jobs", "kill -9", "Postgres restarts", "lost", "wrong results", "dup effects",
     "waiters answered", "timeouts retried", "unavailable retried", "run s", "ok"),
    _cells, _summary, elsewhere={CLUSTER: LEADER_KILLS, NETWORK: PG_LINK_CUT})
