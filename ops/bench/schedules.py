"""Periodic jobs beside Celery beat: two schedulers on one 1 s schedule, how many runs
each firing gets, how late ours start, and how regular each stream of runs is.

Ours: two `Scheduler`s of one type in this process (one leads, by the type's advisory
lock; the other waits) and a worker running the firings, its handler stamping each run.
Celery: two `celery beat` processes and one worker (`peer_beat.py`) on the bench's Redis:
beat has no leader election, so two beats are how a team would run it for failover.
Each contender runs `Scale.schedule_window_s` per run, in a rotated order; the first
`SETTLE_S` of each stream (start-up) are left out.

- runs per firing: handler runs over distinct firings (ours: distinct firing job IDs;
  Celery: the 1 s entry's runs per second, as every beat fires it each second);
- lateness (ours): a run's start less its firing's fire time (from its job ID);
- interval jitter: per stream of runs (ours: the firings, by fire time; Celery: each
  beat's own), |interval - 1 s|, p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import time
from functools import partial
from pathlib import Path

from ops.bench.common import Bench, BenchError, percentile, rotated, run_async, stop_sessions
from ops.bench.peers import (
    PEERS_VENV,
    RedisServer,
    _peer_env,
    ensure_peers_venv,
    ensure_redis_server,
    redis_command,
)
from stream_jobs.app import App
from stream_jobs.client import JobClient
from stream_jobs.context import JobContext
from stream_jobs.job_ids import job_id_time_ms
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka.topics import apply
from stream_jobs.periodic import ScheduleSpec
from stream_jobs.runtime.worker import Worker
from stream_jobs.schedules import Scheduler
from stream_jobs.settings import Settings

PERIOD_S = 1.0
SETTLE_S = 2.0
# Celery's worker needs a moment to connect before the beats send anything.
CELERY_WORKER_START_S = 3.0


def _jitter_ms(times: list[float]) -> list[float]:
    ordered = sorted(times)
    return [abs((b - a) - PERIOD_S) * 1000 for a, b in itertools.pairwise(ordered)]


async def ours_run(settings: Settings, job_type: str, window_s: float) -> dict[str, float]:
    """Two schedulers and a worker for `window_s`; the figures of the steady part."""
    policy = JobTypePolicy(job_type, partitions=2, retry_tiers=("5s",), max_attempts=2,
                           retention_s=7200.0,
                           schedules=(ScheduleSpec("tick", every_s=PERIOD_S),))
    await apply(settings, {job_type: policy})
    app = App(settings)
    runs: list[tuple[str, float]] = []
    expected: list[int] = []  # set once the schedulers stopped: how many firings they sent
    all_ran = asyncio.Event()

    @app.job(job_type, concurrency=8, ordering="unordered")
    async def tick(job: dict[str, object], ctx: JobContext) -> None:
        runs.append((ctx.job_id, time.time()))
        if expected and len(runs) >= expected[0]:
            all_ran.set()

    worker = Worker(settings, policy, app.handler(job_type), scheduler=None)
    firings = partial(JobClient, settings, {policy.job_type: policy})
    schedulers = [Scheduler(settings, policy, policy.schedules, client=firings,
                            holder=f"bench scheduler {x}") for x in "ab"]
    working = asyncio.create_task(worker.run())
    scheduling = [asyncio.create_task(s.run()) for s in schedulers]
    await asyncio.sleep(window_s)  # the measurement window
    for s in schedulers:
        s.request_stop()
    await asyncio.gather(*scheduling)
    expected.append(sum(s.fired for s in schedulers))
    if len(runs) >= expected[0]:
        all_ran.set()
    with contextlib.suppress(TimeoutError):  # the last firings' runs, bounded
        await asyncio.wait_for(all_ran.wait(), 30)
    worker.request_stop()
    await working
    if sum(1 for s in schedulers if s.fired) > 1:
        raise BenchError("both schedulers fired: the lock did not hold")
    fire_s = {job_id: (job_id_time_ms(job_id) or 0) / 1000 for job_id, _ in runs}
    first = min(fire_s.values(), default=0.0)
    steady = [(j, at) for j, at in runs if fire_s[j] >= first + SETTLE_S]
    if len(steady) < 3:
        raise BenchError(f"only {len(steady)} firings ran in the steady window")
    late = [(at - fire_s[j]) * 1000 for j, at in steady]
    first_run: dict[str, float] = {}
    for job_id, at in steady:
        first_run[job_id] = min(at, first_run.get(job_id, at))
    return {"runs_per_firing": len(steady) / len(first_run),
            "late_p50_ms": percentile(late, 50), "late_p99_ms": percentile(late, 99),
            "jitter_p99_ms": percentile(_jitter_ms(list(first_run.values())), 99),
            "firings": float(len(first_run))}


def celery_run(queue: str, window_s: float, log_dir: Path) -> dict[str, float]:
    """Two beats and a worker for `window_s`; the figures of the steady part."""
    runs_file = log_dir / f"{queue}-runs.txt"
    runs_file.unlink(missing_ok=True)
    env = {**_peer_env(queue), "BENCH_RUNS_FILE": str(runs_file)}
    redis_command("FLUSHALL")
    celery = str(PEERS_VENV / "bin" / "celery")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with (log_dir / f"{queue}-worker.log").open("wb") as log:
            procs.append(subprocess.Popen(
                [celery, "-A", "ops.bench.peer_beat", "worker", "--pool", "solo", "-Q", queue,
                 "-n", f"beatw@{queue}", "--without-heartbeat", "--without-gossip",
                 "--without-mingle", "--loglevel", "WARNING"],
                cwd=env["PYTHONPATH"], env=env, stdout=log, stderr=log, start_new_session=True))
        time.sleep(CELERY_WORKER_START_S)  # the worker connects before the first firing
        for name in "ab":
            with (log_dir / f"{queue}-beat-{name}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [celery, "-A", "ops.bench.peer_beat", "beat", "--loglevel", "WARNING",
                     "--schedule", str(log_dir / f"{queue}-beat-{name}.db"),
                     "--pidfile", str(log_dir / f"{queue}-beat-{name}.pid")],
                    cwd=env["PYTHONPATH"], env={**env, "BENCH_BEAT_NAME": name},
                    stdout=log, stderr=log, start_new_session=True))
        time.sleep(window_s)  # the measurement window
        stop_sessions(procs[1:], within_s=20)
        time.sleep(PERIOD_S * 2)  # the worker runs what the beats sent last
    finally:
        stop_sessions(procs, within_s=20)
    streams: dict[str, list[float]] = {}
    text = runs_file.read_text() if runs_file.exists() else ""
    for line in text.splitlines():
        beat, at = line.split()
        streams.setdefault(beat, []).append(float(at))
    if len(streams) < 2:
        raise BenchError(f"Celery beat runs came from {sorted(streams)} only; see {log_dir}")
    # Each beat's own steady part (they start a moment apart): its runs per second, summed
    # over the beats, is how many runs each 1 s firing of the entry got.
    steady = {b: [t for t in ts if t >= min(ts) + SETTLE_S] for b, ts in streams.items()}
    if any(len(ts) < 3 for ts in steady.values()):
        raise BenchError(f"too few Celery beat runs to judge: {steady}")
    per_s = sum((len(ts) - 1) / (max(ts) - min(ts)) for ts in steady.values())
    return {"runs_per_firing": per_s * PERIOD_S,
            "jitter_p99_ms": percentile([j for ts in steady.values() for j in _jitter_ms(ts)],
                                        99),
            "firings": float(max(len(ts) for ts in steady.values()))}


def schedules(b: Bench) -> None:
    ensure_peers_venv()
    binary = ensure_redis_server()
    window_s = b.scale.schedule_window_s
    log_dir = b.out_dir / "schedules"
    log_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, list[dict[str, float]]] = {"ours": [], "celery": []}
    with RedisServer(binary, b.out_dir / "redis-beat"):
        for run in range(b.scale.runs):
            for who in rotated(["ours", "celery"], run):
                if who == "ours":
                    found[who].append(run_async(
                        ours_run(b.settings(), f"bench.sched-{run}", window_s),
                        window_s + 180))
                else:
                    found[who].append(celery_run(f"{b.prefix}-beat-{run}", window_s, log_dir))
    b.results.details["schedules"] = found
    r = b.results
    ours, celery = found["ours"], found["celery"]
    note = f"two schedulers, a 1 s schedule, {window_s:.0f} s per run"
    r.add("ours.sched_runs_per_firing", "two schedulers: runs per firing", "runs",
          [x["runs_per_firing"] for x in ours], note)
    r.add("ours.sched_late_p50", "firing to handler start, p50", "ms",
          [x["late_p50_ms"] for x in ours], note)
    r.add("ours.sched_late_p99", "firing to handler start, p99", "ms",
          [x["late_p99_ms"] for x in ours], note)
    r.add("ours.sched_jitter_p99", "interval between firings' runs, |interval - 1 s| p99",
          "ms", [x["jitter_p99_ms"] for x in ours], note)
    beats = "two `celery beat` processes, one solo worker, a 1 s entry"
    r.add("celery.beat_runs_per_firing", "Celery beat, two beats: runs per firing", "runs",
          [x["runs_per_firing"] for x in celery], beats)
    r.add("celery.beat_jitter_p99", "Celery beat: each beat's |interval - 1 s| p99", "ms",
          [x["jitter_p99_ms"] for x in celery], beats)
