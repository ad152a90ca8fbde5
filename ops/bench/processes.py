"""The processes run: one `stream-jobs worker --processes 2` against `--processes 1`.

The scaling section (`ops.bench.scaling`) starts N separate worker commands; this one
measures what users run to use every core of one machine: a single command whose
supervisor forks the worker processes (`stream_jobs.runtime.supervisor`). Both counts
drain the same no-op backlog on a 12-partition topic of the stack's broker, in one
section, rotating which goes first, so the ratio is side by side.

It reuses the scaling run's method: the command starts while the type is held by its
run-time throttle, is released once the worker group is Stable with every process in it,
and the rate is taken over the steady window of the completion stamps (every process
still had work; `ops.bench.scaling.steady_window`). CPU is sampled from /proc and cut to
the same window: the worker processes (for `--processes 2`, the supervisor's tree: the
children, live and reaped, and the supervisor itself), the broker, Postgres and the whole
machine. The supervisor's own CPU over the whole run is reported apart, as what the
supervision costs.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from ops.bench.backlog import fill, rewind_worker_group
from ops.bench.common import Bench, BenchError, rotated, run_async, stop_sessions
from ops.bench.cpu import machine_busy_s, postgres_cpu_s, process_cpu_s, tree_cpu_s
from ops.bench.scaling import (
    CpuSample,
    Services,
    cores_in_window,
    declare,
    log_tail,
    parse_outcomes,
    run_details,
    steady_window,
    throttle,
    wait_for_group,
)
from ops.bench.scaling_app import NOOP_TYPE, STAMPS_ENV, read_stamps, stamp_files
from ops.bench.snapshot import CODE_DIR, PROJECT_CLI
from stream_jobs.naming import worker_group
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer

PROCESS_COUNTS = (1, 2)
SAMPLE_S = 0.5
HOLD_RATE_PER_S = 0.001  # as the scaling run: one job per process, then nothing
# Its section of RESULTS.md (ops/bench/report/processes.py). On this 2-core box the second
# process must add most of a core's worth of jobs, and supervising must cost nothing per
# job; these goals count in the shared Goals table too.
HEADING = "Worker processes"
GOALS = [  # (text, numerator or figure, denominator or None, op, target, unit)
    ("no-op, `worker --processes 2` >= 1.5x `--processes 1` (2 cores)",
     "processes.p2", "processes.p1", ">=", 1.5, "x"),
    ("the same per worker core >= 0.9x (no CPU per job for the supervision)",
     "processes.p2_per_core", "processes.p1_per_core", ">=", 0.9, "x"),
]


def _sample(services: Services, command: int) -> CpuSample:
    """Cumulative CPU now; the workers are the command's whole process tree."""
    return CpuSample(at=time.monotonic(), workers=tree_cpu_s(command),
                     brokers=sum(process_cpu_s(p) for p in services.brokers),
                     postgres=postgres_cpu_s(services.postmaster), machine=machine_busy_s())


def _stamps(path: Path, processes: int) -> list[list[float]]:
    """Each worker process's sorted completion stamps: the command's own file for one
    process, its children's files for a supervisor."""
    files = [path] if processes == 1 else stamp_files(path)
    if len(files) != processes:
        raise BenchError(f"{len(files)} stamp files for {processes} worker processes")
    return [sorted(read_stamps(f)) for f in files]


def drain(b: Bench, settings: Settings, services: Services, processes: int, n: int,
          tag: str) -> dict[str, Any]:
    """One `stream-jobs worker --processes N --until-idle` drains the backlog."""
    folder = b.out_dir / "processes" / tag
    folder.mkdir(parents=True, exist_ok=True)
    log_path, stamp_path = folder / "worker.log", folder / "worker.stamps"
    argv = [str(PROJECT_CLI), "worker", "ops.bench.scaling_app:app", "--type", NOOP_TYPE,
            "--processes", str(processes), "--until-idle", "--log-level", "WARNING"]
    env = {**b.env(settings.topic_prefix), "STREAM_JOBS_KAFKA_BOOTSTRAP":
           settings.kafka_bootstrap, "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir),
           STAMPS_ENV: str(stamp_path)}
    timeout_s = 120 + n / 200
    run_async(throttle(settings, NOOP_TYPE, HOLD_RATE_PER_S), 60)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with log_path.open("wb") as log:
            procs.append(subprocess.Popen(argv, cwd=CODE_DIR, env=env,
                                          stdout=subprocess.DEVNULL, stderr=log,
                                          start_new_session=True))
        command = procs[0]
        wait_for_group(settings, worker_group(settings.topic_prefix, NOOP_TYPE), processes,
                        procs, [log_path])
        samples = [_sample(services, command.pid)]
        released = samples[0].at
        supervisor_at_release = process_cpu_s(command.pid)
        supervisor_s = 0.0
        run_async(throttle(settings, NOOP_TYPE, None), 60)
        while command.poll() is None:
            if time.monotonic() - released > timeout_s:
                raise BenchError(f"--processes {processes} did not drain {n:,} jobs in "
                                 f"{timeout_s:.0f} s")
            samples.append(_sample(services, command.pid))
            supervisor_s = process_cpu_s(command.pid) - supervisor_at_release
            time.sleep(SAMPLE_S)  # a sampling period, not a wait for a condition
    finally:
        stop_sessions(procs, within_s=30)
        run_async(throttle(settings, NOOP_TYPE, None), 60)
    if command.returncode != 0:
        raise BenchError(f"--processes {processes} exited with {command.returncode}: "
                         f"{log_tail(log_path)}")
    stamps = _stamps(stamp_path, processes)
    steady = steady_window(stamps, since=released)
    if steady.jobs < n:
        raise BenchError(f"--processes {processes} ran {steady.jobs} of {n} jobs")
    return {"brokers": 1, "handler": "noop", "processes": processes, "n": n,
            "rate": steady.rate, "first_to_last_rate": steady.first_to_last_rate,
            "window_s": steady.window_s, "jobs_in_window": steady.jobs_in_window,
            "per_process_jobs": [len(own) for own in stamps],
            "outcomes": parse_outcomes(log_path.read_text(errors="replace")),
            "cores": cores_in_window(samples, steady.window_start, steady.window_end),
            # The supervisor alone (not its children), release to exit; 0 for one process,
            # where the command is the worker.
            "supervisor_cpu_s": supervisor_s if processes > 1 else 0.0,
            "wall_s": samples[-1].at - released}


def processes(b: Bench) -> None:
    began = time.monotonic()
    n = b.scale.scaling_noop_n
    runs: list[dict[str, Any]] = []
    details = b.results.details["processes"] = run_details(b, runs, backlog=n)
    kafka = KafkaCluster(b.stack_settings(), 1)
    settings = b.settings(f"{b.prefix}-procs").model_copy(update={
        "kafka_bootstrap": kafka.bootstrap, "topics_dir": b.out_dir / "topics-processes"})
    services = Services([row.pid for row in kafka.status() if row.pid is not None],
                        PostgresServer(b.stack_settings()).running_pid())
    # Found from the stack's pid files (STREAM_JOBS_STACK_DIR); a stack started elsewhere
    # is measured without them, and the report says so.
    details["cpu_of"] = {"broker": bool(services.brokers),
                         "postgres": services.postmaster is not None}
    run_async(declare(settings, NOOP_TYPE, 1), 120)
    details["fill_jobs_per_s"] = run_async(fill(settings, NOOP_TYPE, n), 60 + n / 200)
    for run in range(b.scale.scaling_runs):
        for count in rotated(list(PROCESS_COUNTS), run):
            tag = f"p{count}-r{run}"
            print(f"[bench] processes {tag}", flush=True)
            runs.append({**drain(b, settings, services, count, n, tag), "repeat": run})
            run_async(rewind_worker_group(settings, NOOP_TYPE), 120)
    details["load_avg_after"] = os.getloadavg()[0]
    details["took_s"] = round(time.monotonic() - began, 1)
    for count in PROCESS_COUNTS:
        mine = [r for r in runs if r["processes"] == count]
        b.results.add(f"processes.p{count}", f"no-op, `worker --processes {count}`", "jobs/s",
                      [r["rate"] for r in mine], "steady window; see Worker processes")
        b.results.add(f"processes.p{count}_per_core",
                      f"no-op, `worker --processes {count}`, per worker core",
                      "jobs/s/core",
                      [r["rate"] / max(float(r["cores"]["workers"]), 1e-9) for r in mine],
                      "jobs/s over the cores the worker processes used")
