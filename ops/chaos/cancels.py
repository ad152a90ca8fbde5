"""Cancels racing runs while workers are killed: `CHAOS_ONLY=cancels make chaos`.

Real `stream-jobs worker ops.chaos.app:app` processes (3 by default) drain 20,000 jobs
(CHAOS_JOBS sets another number) whose effect is a row written through `ctx.once()` (even
jobs) or `ctx.once_deferred()` (odd ones), each transaction held open a few milliseconds
so that cancels and kills land inside it. Meanwhile this process cancels a third of the
jobs, in random order, as they run, and kills a worker with SIGKILL every few seconds (and
starts another), restarting the stack's Postgres after the middle kill: the cancels meet
jobs waiting, running, inside an open transaction, jobs of a dead worker waiting for their
next owner, and a Postgres that is down (a cancel that fails then is made again until it
answers; a retry that answers "already cancelled" means the first one landed).

What it checks, once drained: every job is exactly one of done or cancelled. Done: one
effect row (the table has no unique constraint, so a second would show), and a cancel of
it (if any) answered "already finished". Cancelled: no effect row, and its cancel answered
"cancelled". No job is lost (neither), and every cancel's answer matches the tables.
`make chaos` runs it (`TRIAL`, the protocol of ops/chaos/protocol.py);
`tests/integration/test_cancel_chaos.py` runs it at CI size.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import asyncpg

from ops.chaos import collect, paced
from ops.chaos.app import EFFECTS_TABLE, JOB_TYPE
from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.observe import group_stable
from ops.chaos.protocol import NETWORK, OwnTrial, TrialRow, row
from ops.chaos.staged import PG_LINK_CUT, StageFaults, stage_faults, worker_env
from ops.chaos.trial import Stack
from ops.chaos.workers import WorkerGroup
from stream_jobs.cancels.rules import CancelAnswer
from stream_jobs.client import Job, JobClient
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.stack import PostgresServer
from stream_jobs.testing.stack import declare_type

log = logging.getLogger("ops.chaos.cancels")
JOBS = 20_000
KILLS = 5
TITLE = "cancel a third of the jobs as they run, through kill -9 and a Postgres restart"
METHOD = ("3 `stream-jobs worker ops.chaos.app:app` processes drain 20,000 jobs whose "
          "effect is a row written through `ctx.once()` (even jobs) or "
          "`ctx.once_deferred()` (odd ones), each transaction held open 3 ms; meanwhile "
          "the runner cancels a third of the jobs, in random order, as they run, and kills "
          "a worker with SIGKILL 5 times, 0.5-2 s apart (another starting each time), and "
          "restarts the stack's Postgres (2 s down) after the third, so the cancels meet "
          "jobs waiting, running, inside an open transaction, jobs of a dead worker waiting "
          "for their next owner, and a Postgres that is down (a cancel that fails is made "
          "again until it answers; \"already cancelled\" on a retry means the first "
          "landed). Judged once drained: every job is "
          "exactly one of done (one effect row; a cancel of it answered \"already "
          "finished\") or cancelled (no effect row; its cancel answered \"cancelled\"), "
          "none lost, and the cancels table holds exactly the cancels that won.")
CANCEL_SHARE = 3  # one job in three is cancelled
CANCELLERS = 4
RETRIES = 300  # of a cancel that fails (0.2 s apart: a minute)
PG_OUT_S = 5.0  # about how long a Postgres restart keeps the cancels from answering


@dataclass
class CancelTrialResult:
    jobs: int
    kills: int
    seconds: float = 0.0
    pg_restarts: int = 0
    cancel_retries: int = 0
    staged: dict[str, int] = field(default_factory=dict)  # StageFaults.counts
    cancelled: int = 0
    finished_first: int = 0
    done: int = 0
    duplicate_effects: int = 0
    lost: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def _rows(settings: Settings, sql: str) -> list[str]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return [r[0] for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def _kill_now_and_then(group: WorkerGroup, kills: int, rng: random.Random,
                             postgres: PostgresServer | None, extra: StageFaults) -> int:
    """SIGKILL a worker `kills` times, 0.5 to 2 s apart, starting another each time,
    restart `postgres` (when given) after the middle kill, and the stage's faults after
    theirs; the Postgres restarts."""
    restarts = 0
    for k in range(1, kills + 1):
        await asyncio.sleep(rng.uniform(0.5, 2.0))  # the faults' spacing
        live = group.live()
        if not live:
            break
        group.kill(rng.choice(live))
        group.start()
        if postgres is not None and k == (kills + 1) // 2:
            await paced.restart_postgres(postgres)
            restarts += 1
        await extra.after(k)
    return restarts


async def _cancel(client: JobClient, job_id: str, result: CancelTrialResult) -> CancelAnswer:
    """Cancel `job_id`, again and again while the call fails (Postgres restarting): a
    retry's "already cancelled" says an earlier attempt landed, so it won."""
    for attempt in range(RETRIES):
        try:
            answer = (await client.cancel(job_id, job_type=JOB_TYPE)).answer
        except Exception as exc:  # Postgres down: the cancel may or may not have landed
            log.debug("cancel %s failed (%s: %s); again", job_id, type(exc).__name__, exc)
            result.cancel_retries += 1
            await asyncio.sleep(0.2)  # a retry interval
            continue
        if attempt and answer is CancelAnswer.ALREADY_CANCELLED:
            return CancelAnswer.CANCELLED
        return answer
    raise TimeoutError(f"the cancel of {job_id} failed {RETRIES} times")


async def _drained(settings: Settings, jobs: int, cancelled: int, within_s: float) -> bool:
    """Every job has an effect or was cancelled (the cancels table counts both the
    answers that won and none else)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            effects = await _rows(settings, f"SELECT DISTINCT job_id FROM {EFFECTS_TABLE}")
            if len(effects) + cancelled >= jobs:
                return True
        await asyncio.sleep(0.5)  # a poll interval
    return False


async def _race(client: JobClient, group: WorkerGroup, result: CancelTrialResult,
                postgres: PostgresServer | None, extra: StageFaults
                ) -> tuple[list[str], dict[str, CancelAnswer]]:
    """Enqueue the jobs, then cancel a third of them in random order while a worker is
    killed now and then (and Postgres restarted): (the job IDs, each cancel's answer)."""
    jobs, kills = result.jobs, result.kills
    rng = random.Random(jobs)
    answers: dict[str, CancelAnswer] = {}
    async with client:
        ids: list[str] = []
        for start in range(0, jobs, 1000):
            ids += await client.enqueue_many(Job(JOB_TYPE, {"n": i})
                                             for i in range(start, min(jobs, start + 1000)))
        chosen = rng.sample(ids, len(ids) // CANCEL_SHARE)
        killing = asyncio.create_task(_kill_now_and_then(group, kills, rng, postgres, extra))
        # Cancels spread over the kills' time, so that they meet dead workers' jobs.
        # With a Postgres restart and a link cut on the way, longer: they meet them too.
        over_s = 1.25 * kills + 1.0 + (PG_OUT_S if postgres else 0.0) + extra.link.lasts_s
        paced = time.monotonic()

        async def canceller(share: list[str]) -> None:
            for i, job_id in enumerate(share):
                due = paced + over_s * i / max(1, len(share))
                await asyncio.sleep(max(0.0, due - time.monotonic()))  # the pace
                answers[job_id] = await _cancel(client, job_id, result)

        await asyncio.gather(*(canceller(chosen[k::CANCELLERS]) for k in range(CANCELLERS)))
        result.pg_restarts = await killing
        result.kills = len(group.killed)
        return ids, answers


async def cancel_trial(base: Settings, out_dir: Path, *, jobs: int, kills: int,
                       workers: int = 3, hold_ms: int = 3,
                       stack: Stack | None = None) -> CancelTrialResult:
    """One run (see the module's docstring); a clean run leaves nothing behind. With
    `stack`, restarts its Postgres once during the race and meets its stage's faults."""
    began = time.monotonic()
    result = CancelTrialResult(jobs, kills)
    settings, folder = fresh_settings(base, out_dir, "cancels")
    await prepare_schema(settings, [collect.SCHEMA_SQL])
    policy = await declare_type(settings, JOB_TYPE, partitions=6, retry_tiers=["1s", "5s"],
                                max_attempts=8)
    group = WorkerGroup(settings, folder, hold_ms=hold_ms, env=worker_env(stack))
    extra = stage_faults(stack, settings, [policy], kills)
    try:
        for _ in range(workers):
            group.start()
        await group_stable(settings, JOB_TYPE, workers, within_s=120)
        ids, answers = await _race(JobClient(settings, {JOB_TYPE: policy}), group, result,
                                   stack.postgres if stack else None, extra)
        result.staged = extra.counts()
        won = sum(1 for a in answers.values() if a is CancelAnswer.CANCELLED)
        if not await _drained(settings, jobs, won, 600):
            result.problems.append("not drained within 600 s")
        group.close()
        effects = await _rows(settings, f"SELECT job_id FROM {EFFECTS_TABLE}")
        cancels = set(await _rows(settings, "SELECT job_id FROM stream_jobs_cancels"))
    finally:
        group.close()
    _judge(result, ids, answers, effects, cancels)
    result.seconds = round(time.monotonic() - began, 1)
    await settle(settings, folder, result.problems)
    return result


def _judge(result: CancelTrialResult, ids: list[str], answers: dict[str, CancelAnswer],
           effects: list[str], cancels: set[str]) -> None:
    done = set(effects)
    won = {j for j, a in answers.items() if a is CancelAnswer.CANCELLED}
    first = {j for j, a in answers.items() if a is CancelAnswer.ALREADY_FINISHED}
    result.cancelled, result.finished_first, result.done = len(won), len(first), len(done)
    result.duplicate_effects = len(effects) - len(done)
    result.lost = len(set(ids) - done - won)
    problems = result.problems
    if result.duplicate_effects:
        problems.append(f"{result.duplicate_effects} effects written twice")
    if both := done & won:
        problems.append(f"{len(both)} jobs both done and cancelled, e.g. {min(both)}")
    if missing := first - done:
        problems.append(f"{len(missing)} cancels said 'already finished' of jobs with no "
                        f"effect, e.g. {min(missing)}")
    if result.lost:
        problems.append(f"{result.lost} jobs neither done nor cancelled")
    if cancels != won:
        problems.append(f"the cancels table holds {len(cancels)} rows for {len(won)} cancels")
    if other := {a for a in answers.values()} - {CancelAnswer.CANCELLED,
                                                  CancelAnswer.ALREADY_FINISHED}:
        problems.append(f"unexpected answers: {sorted(other)}")
    if not won or not first:
        problems.append("the cancels did not race the runs (all won, or none did)")


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    started = time.time()
    result = await cancel_trial(stack.settings, out_dir, jobs=jobs or JOBS, kills=KILLS,
                                stack=stack)
    counts = {k: v for k, v in asdict(result).items()
              if k not in ("seconds", "problems", "staged")}
    counts.update(result.staged)
    return row(run, started, result.problems, **counts)


def _cells(r: TrialRow) -> list[str]:
    return [f"{r['jobs']:,}", str(r["kills"]), str(r.get("pg_restarts", 0)),
            str(r.get("cancel_retries", 0)), f"{r['cancelled']:,}",
            f"{r['finished_first']:,}", f"{r['done']:,}", str(r["duplicate_effects"]),
            str(r["lost"]), f"{r['seconds']:.0f}", "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"{r['jobs']:,} jobs, {r['kills']} kills, {r.get('pg_restarts', 0)} Postgres "
            f"restarts: {r['cancelled']} cancelled, "
            f"{r['finished_first']} finished before their cancel, {r['done']} done, "
            f"dup effects {r['duplicate_effects']}, lost {r['lost']}")


TRIAL = OwnTrial(
    "cancels", "Cancels racing runs", TITLE, METHOD, _run,
    ("jobs", "kill -9", "Postgres restarts", "cancels retried", "cancelled",
     "finished before their cancel", "done", "dup effects", "lost", "run s", "ok"),
    _cells, _summary, elsewhere={NETWORK: PG_LINK_CUT})
