"""The LISTEN connections blackholed while the rest works: `CHAOS_ONLY=listen make chaos`.

A run gets a fresh prefix and schema and a Toxiproxy link of its own in front of Postgres
that only the LISTEN connections use (`STREAM_JOBS_DATABASE_LISTEN_URL`): the workers'
cancel watch and outbox relay, and the runner's result waits. Two `stream-jobs worker
ops.chaos.listen_app:app` processes run `chaos.listen`. The runner starts `HOLDS` jobs
that wait until cancelled, then blackholes the link for `SILENT_S` (bytes go nowhere, no
RST) and meanwhile: cancels the held jobs (their notices go into the silent link), commits
work jobs through the outbox (`enqueue(conn=...)`: the relay's wake-up is lost too) and
enqueues others directly, and waits for a sample of the results with `client.result()`.
Then the link returns. Judged (`listen_verdict.judge`): every cancelled job interrupted
within `INTERRUPT_BOUND_S` of the link's return, every work job's effect exactly once
(the outbox's among them), every waited result right.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict
from pathlib import Path

import asyncpg

from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.listen_app import INTERRUPTS_ENV, LISTEN_TYPE, TABLES, make_app
from ops.chaos.listen_verdict import INTERRUPT_BOUND_S, ListenEvidence, judge
from ops.chaos.netproxy import HOST, Link, NetProxy, _with_port
from ops.chaos.observe import group_stable
from ops.chaos.protocol import OwnTrial, TrialRow, row
from ops.chaos.trial import Stack
from ops.chaos.workers import STREAM_JOBS, WorkerGroup
from stream_jobs.client import Job, JobClient
from stream_jobs.errors import ResultTimeout, StreamJobsError
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import declare_type

log = logging.getLogger("ops.chaos.listen")
HOLDS = 8
WORK = 2_000  # half through the outbox, half direct
WAITED = 100
SILENT_S = 20.0
APP_SPEC = "ops.chaos.listen_app:app"
TITLE = "the LISTEN connections blackholed while the rest works"
METHOD = (f"a Toxiproxy link in front of Postgres that only the LISTEN connections use "
          f"(`STREAM_JOBS_DATABASE_LISTEN_URL`: the workers' cancel watch and outbox relay, "
          f"the runner's result waits); 2 `stream-jobs worker` processes; {HOLDS} jobs wait "
          f"until cancelled; the link is blackholed for {SILENT_S:.0f} s (no RST) and "
          f"meanwhile the held jobs are cancelled (their notices go into the silent link), "
          f"{WORK:,} work jobs are committed, half through the outbox (`enqueue(conn=...)`, "
          f"whose wake-up is lost too) and half directly, and {WAITED} of them are waited "
          f"for with `client.result()`. Judged: every cancelled job interrupted within "
          f"{INTERRUPT_BOUND_S:.0f} s of the link's return, every work job's effect exactly "
          f"once, every waited result right.")


async def _started(group: WorkerGroup, client: JobClient, notes: Path) -> list[str]:
    """Enqueue the hold jobs and wait until the workers run them all."""
    holds = await client.enqueue_many(Job(LISTEN_TYPE, {"kind": "hold", "n": i})
                                      for i in range(HOLDS))
    deadline = time.monotonic() + 60
    while not set(holds) <= set(_noted(notes, "started")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every hold job running after 60 s\n{group.tails()}")
        await asyncio.sleep(0.2)  # a poll interval
    return holds


async def _through_outbox(settings: Settings, client: JobClient, numbers: range) -> list[str]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        ids: list[str] = []
        for start in range(numbers.start, numbers.stop, 50):
            async with conn.transaction():
                ids += await client.enqueue_many(
                    (Job(LISTEN_TYPE, {"kind": "work", "n": n})
                     for n in range(start, min(numbers.stop, start + 50))), conn=conn)
        return ids
    finally:
        await conn.close()


async def _wait(client: JobClient, job_id: str, answers: dict[str, object]) -> None:
    while True:
        try:
            answers[job_id] = await client.result(job_id, timeout=30)
            return
        except (ResultTimeout, StreamJobsError) as exc:
            log.info("result of %s: %s; asking again", job_id, exc)


async def _silence(link: Link, client: JobClient, settings: Settings, holds: list[str],
                   answers: dict[str, object]) -> tuple[dict[str, float], dict[str, int],
                                                        float, list[asyncio.Task[None]]]:
    """The fault and what happens during it; (cancelled, work, healed at, waiters)."""
    await link.blackhole()
    began = time.monotonic()
    cancelled: dict[str, float] = {}
    for job_id in holds:
        if (await client.cancel(job_id, job_type=LISTEN_TYPE)).changed:
            cancelled[job_id] = time.time()
    half = WORK // 2
    outboxed = await _through_outbox(settings, client, range(half))
    direct = await client.enqueue_many(Job(LISTEN_TYPE, {"kind": "work", "n": n})
                                       for n in range(half, WORK))
    work = {job_id: n for n, job_id in enumerate([*outboxed, *direct])}
    sample = [*outboxed[:WAITED // 2], *direct[:WAITED // 2]]
    waiters = [asyncio.create_task(_wait(client, j, answers)) for j in sample]
    await asyncio.sleep(max(0.0, SILENT_S - (time.monotonic() - began)))  # the fault's length
    await link.clear()
    return cancelled, work, time.time(), waiters


async def listen_trial(base: Settings, out_dir: Path) -> ListenEvidence:
    settings, folder = fresh_settings(base, out_dir, "listen")
    await prepare_schema(settings, list(TABLES))
    await declare_type(settings, LISTEN_TYPE, partitions=4, retry_tiers=["1s"],
                                max_attempts=5)
    proxy = await NetProxy(settings.stack_dir, folder / "toxiproxy").start()
    interrupts_file = folder / "interrupts.log"
    group: WorkerGroup | None = None
    try:
        link = await proxy.link("listen", f"{HOST}:{settings.dev_postgres_port}")
        via = _with_port(settings.database_url, link.listen)
        group = WorkerGroup(settings, folder, argv=(str(STREAM_JOBS), "worker", APP_SPEC),
                            env={"STREAM_JOBS_DATABASE_LISTEN_URL": via,
                                 INTERRUPTS_ENV: str(interrupts_file)})
        for _ in range(2):
            group.start()
        await group_stable(settings, LISTEN_TYPE, 2, within_s=120)
        client = make_app(settings.model_copy(update={"database_listen_url": via})).client()
        answers: dict[str, object] = {}
        async with client:
            holds = await _started(group, client, interrupts_file)
            cancelled, work, healed, waiters = await _silence(link, client, settings, holds,
                                                              answers)
            await asyncio.wait_for(asyncio.gather(*waiters), 300)
            await _until_done(settings, work, cancelled, interrupts_file)
        effects = await _effects(settings)
    finally:
        if group is not None:
            group.close()
        proxy.stop()
    evidence = ListenEvidence(healed, cancelled, _noted(interrupts_file, "interrupted"), work,
                              effects, answers)
    await settle(settings, folder, judge(evidence).problems)
    return evidence


async def _until_done(settings: Settings, work: dict[str, int], cancelled: dict[str, float],
                      interrupts_file: Path, within_s: float = 300.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done = len(set(await _effects(settings)) & set(work))
        if done >= len(work) and set(cancelled) <= set(_noted(interrupts_file, "interrupted")):
            return
        await asyncio.sleep(0.5)  # a poll interval


async def _effects(settings: Settings) -> list[str]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return [r[0] for r in await conn.fetch("SELECT job_id FROM listen_effects")]
    finally:
        await conn.close()


def _noted(path: Path, what: str) -> dict[str, float]:
    """The hold jobs' `what` lines: job ID -> its first time."""
    found: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            kind, job_id, at = line.split()
            if kind == what:
                found.setdefault(job_id, float(at))
    return found


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    started = time.time()
    evidence = await listen_trial(stack.settings, out_dir)
    v = judge(evidence)
    counts = {k: val for k, val in asdict(v).items() if k != "problems"}
    return row(run, started, v.problems, cancelled=len(evidence.cancelled),
               work=len(evidence.work), waited=len(evidence.waited), **counts)


def _cells(r: TrialRow) -> list[str]:
    worst = r["worst_interrupt_s"]
    return [str(r["cancelled"]), f"{r['work']:,}", str(r["waited"]),
            "-" if worst is None else f"{worst:.1f}", str(r["not_interrupted"]),
            str(r["lost"]), str(r["duplicate_effects"]), str(r["wrong_results"]),
            f"{r['seconds']:.0f}", "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"{r['cancelled']} cancels into the silence, worst interrupt "
            f"{r['worst_interrupt_s']} s after the link returned; {r['work']} work jobs, "
            f"lost {r['lost']}, dup {r['duplicate_effects']}, wrong results "
            f"{r['wrong_results']}")


TRIAL = OwnTrial(
    "listen", "LISTEN connections gone silent", TITLE, METHOD, _run,
    ("cancelled in the silence", "work jobs", "results waited", "interrupt s after the "
     "link returned (worst)", "never interrupted", "lost", "dup effects", "wrong results",
     "run s", "ok"), _cells, _summary,
    notes=("The bound: the probe (`SELECT 1` every 5 s, 5 s to answer) finds the silent "
           "link during the fault; after the link returns the watch connects again within "
           "its backoff (at most 5 s) and its reload finds the cancels and interrupts the "
           "jobs."))
