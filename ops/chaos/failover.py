"""The scheduler failover scenario: two `stream-jobs scheduler` processes on a 1 s
schedule, the leader SIGKILLed (and restarted) several times, Postgres restarted once
(every session cut: the leader's advisory lock is gone with it), then the leader frozen
with SIGSTOP past its lease once; every firing of the window must run exactly once.

A run gets a fresh prefix and schema. The firings are run by a worker in this process
(it takes no part in scheduling), whose handler writes one row per firing through
`ctx.once()` into a table without a unique key. Faults are spread over the window; after
each one the runner samples `pg_locks` until another scheduler holds the type's lock
(takeover). At the end the schedulers get SIGTERM, the worker drains, and
`failover_verdict.judge` decides from the lane's records and the effect rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import asyncpg

from ops.chaos import paced
from ops.chaos.app import TICK_EFFECTS_TABLE, TICK_TYPE
from ops.chaos.app import app as chaos_app
from ops.chaos.collect import read_topic
from ops.chaos.failover_verdict import FailoverEvidence, FailoverVerdict, LeaderFault, judge
from ops.chaos.faults import until
from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.leaders import LeaderKills
from ops.chaos.protocol import CLUSTER, OwnTrial, TrialRow, row
from ops.chaos.staged import LEADER_KILLS, replication, worker_env
from ops.chaos.trial import Stack
from ops.chaos.workers import APP_SPEC, STREAM_JOBS, WorkerGroup, WorkerProcess
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import lane_topic
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.runtime.worker import Worker
from stream_jobs.schedules.leader import leaders
from stream_jobs.settings import Settings
from stream_jobs.stack import PostgresServer

log = logging.getLogger("ops.chaos")

TITLE = ("kill -9 the scheduler leader 3 times in 60 s, restart Postgres, then SIGSTOP "
         "the leader past its lease")
METHOD = (
    "Two `stream-jobs scheduler ops.chaos.app:app --type chaos.tick` processes share a "
    "1 s schedule (`every = \"1s\"`, missed = latest). Over a 60 s window the leader "
    "(the process holding the type's advisory lock, read from `pg_locks`) is SIGKILLed "
    "3 times, a replacement starting at once; then the stack's Postgres is restarted "
    "(2 s down: every session is cut, the leader's lock with it, and a scheduler must "
    "take it again); then the leader is SIGSTOPped for its lease + 5 s (lease 10 s) and "
    "resumed. A worker in the runner runs the firings, each writing one "
    "row through `ctx.once()` into a table without a unique key. Goal: every fire time "
    "from the first firing to the last has exactly one effect; a firing enqueued twice "
    "(a leader that froze after its enqueue) is a `duplicate` outcome. The failover gap "
    "is the time from a fault to the next firing enqueued by anyone; takeover is the "
    "time until another scheduler held the lock.")
SCHEMA_SQL = (f"CREATE TABLE {TICK_EFFECTS_TABLE} (job_id text NOT NULL, fire_ms bigint, "
              "at timestamptz NOT NULL DEFAULT clock_timestamp())")
TOML = ('partitions = 2\nreplication_factor = {replication}\n[[schedules]]\nname = "tick"\n'
        'every = "1s"\n')
SCHEDULE = "tick"
# How often the runner asks Postgres who holds the lock after a fault.
LOCK_POLL_S = 0.05


@dataclass
class FailoverResult:
    run: int
    verdict: FailoverVerdict
    seconds: float
    started: float  # epoch seconds
    window_s: float
    lease_s: float
    faults: list[LeaderFault]
    notes: list[str] = field(default_factory=list)
    leader_kills: int = 0  # brokers killed on the cluster (`failover@cluster`)


class FailoverError(Exception):
    """The run could not be carried out (no leader appeared, a process would not start)."""


async def run_failover(base: Settings, out_dir: Path, *, run: int = 1, window_s: float = 60.0,
                       kills: int = 3, pause: bool = True,
                       lease_s: float = 10.0,
                       postgres: PostgresServer | None = None,
                       stack: Stack | None = None) -> FailoverResult:
    """One run: `kills` SIGKILLs of the leader, (with `postgres`) a restart of it, and
    (with `pause`) one SIGSTOP of lease + 5 s, spread over `window_s` seconds of a 1 s
    schedule; on `stack`'s cluster, the broker leading the lane's partition 0 killed
    after some of the kills too (`leaders.LeaderKills`)."""
    began = time.time()
    settings, folder = fresh_settings(base, out_dir, f"failover-{run}",
                                      scheduler_lease_s=lease_s)
    # A schedule is a TOML table, which `declare_type`'s keys cannot express.
    (settings.topics_dir / f"{TICK_TYPE}.toml").write_text(
        TOML.format(replication=replication(stack)))
    policy = load_job_types(settings.topics_dir)[TICK_TYPE]
    prefix = settings.topic_prefix
    leaders = LeaderKills.of(stack.cluster if stack is not None else None, settings,
                             lane_topic(prefix, TICK_TYPE),
                             [spec.name for spec in policy.all_topics(prefix)], kills)
    await prepare_schema(settings, [SCHEMA_SQL])
    await apply(settings, {TICK_TYPE: policy})
    group = WorkerGroup(settings, folder,
                        argv=(str(STREAM_JOBS), "scheduler", APP_SPEC, "--type", TICK_TYPE),
                        env={"STREAM_JOBS_SCHEDULER_LEASE_S": str(lease_s),
                             **worker_env(stack)})
    worker = Worker(settings, policy, chaos_app.handler(TICK_TYPE), scheduler=None)
    working = asyncio.create_task(worker.run())
    try:
        group.start()
        group.start()
        await _until(lambda: _effects(settings, at_least=1), 120, "a first firing ran", group)
        faults = await _fault_window(settings, group, window_s, kills, pause, lease_s,
                                     postgres, leaders.after)
        notes = await _stop_schedulers(group)
        worker.request_stop()
        await asyncio.wait_for(working, 60)
        drained = Worker(settings, policy, chaos_app.handler(TICK_TYPE), scheduler=None)
        await asyncio.wait_for(drained.run(until_idle=True), 120)
        evidence = await _evidence(settings, policy, faults,
                                   worker.outcomes["duplicate"] + drained.outcomes["duplicate"])
    finally:
        if not working.done():
            worker.request_stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(working, 30)
        group.close()
    verdict = judge(evidence)
    await settle(settings, folder, verdict.problems)
    return FailoverResult(run, verdict, time.time() - began, began, window_s, lease_s, faults,
                          notes, len(leaders.nodes))


async def _fault_window(settings: Settings, group: WorkerGroup, window_s: float, kills: int,
                        pause: bool, lease_s: float, postgres: PostgresServer | None,
                        after_kill: Callable[[int], Awaitable[None]]) -> list[LeaderFault]:
    """`kills` kills of the leader, each followed by `after_kill(k)` (k from 1), then (with
    `postgres`) a restart of it, then (with `pause`) a freeze of lease + 5 s, spread evenly
    over `window_s` seconds; returns at the window's end."""
    faults: list[LeaderFault] = []
    window_began = time.time()
    steps: list[Callable[[], Awaitable[LeaderFault]]] = [
        *[partial(_kill_leader, settings, group)] * kills,
        *([partial(_restart_postgres, settings, postgres)] if postgres is not None else []),
        *([partial(_freeze_leader, settings, group, lease_s + 5.0)] if pause else [])]
    for i, step in enumerate(steps):
        due = window_began + window_s * (i + 1) / (len(steps) + 1)
        await asyncio.sleep(max(0.0, due - time.time()))  # the fault's moment
        faults.append(await step())
        if i < kills:
            await after_kill(i + 1)
    await asyncio.sleep(max(0.0, window_began + window_s - time.time()))  # window's end
    return faults


async def _stop_schedulers(group: WorkerGroup) -> list[str]:
    """SIGTERM every scheduler still running and wait for it; a note per unclean exit."""
    notes = []
    for member in group.live():
        group.terminate(member)
    for member in group.members:
        rc = await asyncio.to_thread(group.stopped, member)
        if rc not in (0, -9) and member not in group.killed:
            notes.append(f"{member.name} exited with {rc} after SIGTERM")
    return notes


async def _leader(settings: Settings, group: WorkerGroup,
                  other_than: str | None = None) -> tuple[str, WorkerProcess | None]:
    """(holder's application name, its process) once someone other than `other_than`
    holds the lock."""
    while True:
        holder = (await leaders(settings, [TICK_TYPE])).get(TICK_TYPE)
        if holder is not None and holder != other_than:
            pid = int(holder.rsplit(" ", 1)[-1]) if holder.rsplit(" ", 2)[-2] == "pid" else -1
            return holder, next((m for m in group.members if m.pid == pid), None)
        await asyncio.sleep(LOCK_POLL_S)  # a sampling period


async def _kill_leader(settings: Settings, group: WorkerGroup) -> LeaderFault:
    holder, victim = await asyncio.wait_for(_leader(settings, group), 30)
    if victim is None:
        raise FailoverError(f"the lock holder {holder!r} is none of the runner's schedulers")
    at = time.time()
    group.kill(victim)
    log.info("failover: kill -9 the leader %s", victim.name)
    group.start()
    healed = time.time()
    await asyncio.wait_for(_leader(settings, group, other_than=holder), 60)
    return LeaderFault("kill -9", at, healed, time.time() - at)


async def _freeze_leader(settings: Settings, group: WorkerGroup,
                         pause_s: float) -> LeaderFault:
    holder, victim = await asyncio.wait_for(_leader(settings, group), 30)
    if victim is None:
        raise FailoverError(f"the lock holder {holder!r} is none of the runner's schedulers")
    at = time.time()
    group.pause(victim)
    log.info("failover: SIGSTOP the leader %s for %.0f s", victim.name, pause_s)
    takeover: float | None = None
    try:
        await asyncio.wait_for(_leader(settings, group, other_than=holder), pause_s)
        takeover = time.time() - at
    except TimeoutError:
        pass
    await asyncio.sleep(max(0.0, at + pause_s - time.time()))  # the freeze itself
    group.resume(victim)
    return LeaderFault("SIGSTOP", at, time.time(), takeover)


async def _restart_postgres(settings: Settings, postgres: PostgresServer) -> LeaderFault:
    """Restart Postgres: every session is cut, the leader's advisory lock with it. The
    takeover is the time until a scheduler holds the lock again."""
    at = time.time()
    log.info("failover: restart Postgres under the schedulers")
    await paced.restart_postgres(postgres)
    healed = time.time()

    async def held() -> bool:
        return (await leaders(settings, [TICK_TYPE])).get(TICK_TYPE) is not None

    await until(held, 60, "a scheduler holding the lock after the Postgres restart")
    return LeaderFault("pg restart", at, healed, time.time() - at)


async def _effects(settings: Settings, at_least: int) -> bool:
    conn = await asyncpg.connect(settings.database_url, timeout=5,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {TICK_EFFECTS_TABLE}")) >= at_least
    finally:
        await conn.close()


async def _until(check: Callable[[], Awaitable[bool]], within_s: float, what: str,
                 group: WorkerGroup) -> None:
    deadline = time.monotonic() + within_s
    while True:
        with contextlib.suppress(Exception):  # a probe failing meanwhile is a "not yet"
            if await check():
                return
        if time.monotonic() > deadline:
            raise FailoverError(f"timed out after {within_s:.0f} s waiting for {what}\n"
                                + group.tails())
        await asyncio.sleep(0.1)


async def _evidence(settings: Settings, policy: JobTypePolicy, faults: list[LeaderFault],
                    duplicate_outcomes: int) -> FailoverEvidence:
    records = await read_topic(settings, lane_topic(settings.topic_prefix, TICK_TYPE))
    enqueued = [(dict(r.headers)[HEADER_JOB_ID].decode(), r.timestamp / 1000) for r in records]
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        effects = [row["job_id"] for row in
                   await conn.fetch(f"SELECT job_id FROM {TICK_EFFECTS_TABLE}")]
    finally:
        await conn.close()
    return FailoverEvidence(settings.topic_prefix, TICK_TYPE, SCHEDULE, enqueued, effects,
                            faults, duplicate_outcomes)


def _late(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _each(values: list[float | None], kinds: list[str], kind: str) -> str:
    picked = [v for v, k in zip(values, kinds, strict=False) if k == kind]
    return ", ".join(_late(v) if v is None else f"{v:.2f}" for v in picked) or "-"


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    """One run at `make chaos`'s size (the window is a time: CHAOS_JOBS does not apply)."""
    result = await run_failover(stack.settings, out_dir, run=run, postgres=stack.postgres,
                                stack=stack)
    v = result.verdict
    return row(run, result.started, v.problems, result.notes, window_s=result.window_s,
               lease_s=result.lease_s, firings=v.firings, missed=len(v.missed),
               duplicate_effects=v.duplicate_effects, enqueued_twice=v.enqueued_twice,
               duplicate_outcomes=v.duplicate_outcomes,
               faults=[f.kind for f in result.faults], takeovers_s=v.takeovers_s,
               gaps_s=v.gaps_s, late_ms=[v.late(50), v.late(99), v.late(100)],
               leader_kills=result.leader_kills)


def _cells(r: TrialRow) -> list[str]:
    when = datetime.fromtimestamp(r["started"], UTC).strftime("%m-%d %H:%M")
    takeovers, gaps, kinds = r["takeovers_s"], r["gaps_s"], r["faults"]
    return [when, f"{r['window_s']:.0f}", str(r["firings"]), str(r["missed"]),
            str(r["duplicate_effects"]), f"{r['enqueued_twice']} / {r['duplicate_outcomes']}",
            _each(takeovers, kinds, "kill -9"),
            f"{_each(takeovers, kinds, 'SIGSTOP')} ({r['lease_s']:.0f})",
            _each(gaps, kinds, "kill -9"), _each(gaps, kinds, "SIGSTOP"),
            f"{_each(takeovers, kinds, 'pg restart')} / {_each(gaps, kinds, 'pg restart')}",
            " / ".join(_late(v) for v in r["late_ms"]), f"{r['seconds']:.0f}"]


def _summary(r: TrialRow) -> str:
    return (f"missed {r['missed']}, dup effects {r['duplicate_effects']}, takeovers "
            f"{r['takeovers_s']}, gaps {[round(g, 2) for g in r['gaps_s']]}")


NOTES = ("The failover gap is the time from a fault to the next firing any scheduler "
         "enqueued; with a 1 s schedule it includes the wait for the next fire time (up to "
         "1 s). After kill -9 the lock is free as soon as Postgres sees the socket close, and "
         "the waiting scheduler, blocked in `pg_advisory_lock`, has it at once; after "
         "SIGSTOP the frozen leader's socket stays open, so the lock is released when its "
         "session has been idle for the lease (`idle_session_timeout`), and the firings due "
         "meanwhile run late, not missed (a firing up to 30 s overdue always runs). A Postgres "
         "restart cuts every session: no one holds the lock until the schedulers connect "
         "again, and the firings due meanwhile run late.")
TRIAL = OwnTrial(
    "failover", "Scheduler failover", TITLE, METHOD, _run,
    ("when (UTC)", "window s", "firings", "missed", "dup effects",
     "enqueued twice / duplicate outcomes", "takeover s after kill -9",
     "takeover s after SIGSTOP (lease)", "failover gap s after kill -9",
     "failover gap s after SIGSTOP", "takeover / gap s after Postgres restart",
     "firing late ms p50 / p99 / max", "run s"),
    _cells, _summary, NOTES, elsewhere={CLUSTER: LEADER_KILLS})
