"""The noisy neighbour (issue 27, docs/fairness.md), side by side in one run:

    BENCH_ONLY=fairness .venv/bin/python -m ops.bench.run      # about 4 minutes

- **noisy neighbour**, `[fairness]` on and off: `stream-jobs worker ops.bench.fair_app:app
  --processes 2` of a type with a `[fairness]` table (`bench.fair-on`), then of one
  without (`bench.fair-off`), twice each, rotating which goes first. The
  workers start held by the type's run-time throttle; once their group is Stable, tenant
  A enqueues 50,000 jobs (in batches of 500, each awaited), the workers are released,
  and ten quiet tenants enqueue 10 jobs/s each for 30 s; every handler sleeps 2 ms. From
  the stamps (ops/bench/fair_app.py): the quiet tenants' dwell (enqueue to start)
  p50/p99, A's completion (release to its last job's end) and the type's throughput
  while A's backlog lasted (ops/bench/fair_figures.py), with the 1-minute load average
  before and after each arm.
- **per-tenant concurrency**: 3 worker processes of a type with `tenant_concurrency =
  TENANT_LIMIT`, four tenants of 500 jobs of 20 ms each; the most of one tenant's jobs
  running at once across the processes, from their start and end stamps. Only where the
  runtime has per-tenant limits (`stream_jobs.fairness.gate`); elsewhere the row says so.
- **no-op without `[fairness]`** against the code before issue 27 (ops/bench/before.py).

Every job names its tenant (`enqueue_many` of `Job(..., tenant=...)`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.bench.backlog import ENQUEUE_BATCH
from ops.bench.before import BEFORE_COMMIT, noop_side_by_side
from ops.bench.common import PARTITIONS, Bench, BenchError, rotated, run_async, stop_sessions
from ops.bench.fair_app import FAIR_LIMIT, FAIR_OFF, FAIR_ON, STAMPS_ENV, read_stamps, stamps_done
from ops.bench.fair_figures import most_running_by_tenant, noisy_run_figures
from ops.bench.scaling import HOLD_RATE_PER_S, log_tail, throttle, wait_for_group
from ops.bench.snapshot import CODE_DIR, PROJECT_CLI
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import worker_group
from stream_jobs.settings import Settings

HEADING = "Fair queues"
PREFIX = "fairness."
TENANT_LIMIT = 4
# Runs of each noisy-neighbour arm (one in a quick run): each lasts about 45 s, and the
# section must stay near 5 minutes.
NOISY_RUNS = 2
# (text, figure or numerator, denominator or None, op, target, unit): the report
# (ops/bench/report/fairness.py) adds the without-figure and the tenant_concurrency row.
GOALS = [
    ("quiet tenants' dwell p99 with `[fairness]` <= 1 s", "fairness.quiet_p99_on", None,
     "<=", 1000.0, "ms"),
    ("the type's throughput with `[fairness]` >= 0.9x without",
     "fairness.throughput_on", "fairness.throughput_off", ">=", 0.9, "x"),
    (f"no-op, a type with no `[fairness]` table >= 0.97x today's ({BEFORE_COMMIT})",
     "fairness.noop_now", "fairness.noop_before", ">=", 0.97, "x"),
]
LIMIT_GOAL = ("`tenant_concurrency` never exceeded (max observed across processes == the "
              "limit) while 3 processes run")
NOT_RUN = "not run: per-tenant limits not on this commit"


@dataclass(frozen=True)
class Load:
    """What one noisy-neighbour arm offers."""

    flood: int = 50_000
    quiet_tenants: int = 10
    quiet_rate_per_s: float = 10.0  # per quiet tenant
    quiet_s: float = 30.0
    hold_ms: int = 2
    processes: int = 2

    @property
    def jobs(self) -> int:
        return self.flood + self.quiet_tenants * int(self.quiet_s * self.quiet_rate_per_s)


QUICK_LOAD = Load(flood=10_000, quiet_s=10.0)


def limits_supported() -> bool:
    """Whether this code has per-tenant limits across the fleet (issue 27, point 4)."""
    return importlib.util.find_spec("stream_jobs.fairness.gate") is not None


# -- the types and their jobs ----------------------------------------------------------------


async def declare(settings: Settings, job_type: str, fairness: str | None) -> None:
    """topics/<type>.toml (6 partitions, one 5 s tier), with `fairness` as the body of its
    `[fairness]` table when given, and Kafka made to match for this type only."""
    settings.topics_dir.mkdir(parents=True, exist_ok=True)
    text = (f'partitions = {PARTITIONS}\nretry_tiers = ["5s"]\nmax_attempts = 2\n'
            'retention = "2h"\n')
    if fairness is not None:
        text += f"\n[fairness]\n{fairness}"
    (settings.topics_dir / f"{job_type}.toml").write_text(text)
    types = load_job_types(settings.topics_dir)
    await apply(settings, {job_type: types[job_type]})


def tenant_jobs(job_type: str, jobs: Iterable[tuple[str, int]], hold_ms: int) -> list[Job]:
    """A job per (tenant, tenant index), in its tenant's name."""
    return [Job(job_type, {"t": index, "hold_ms": hold_ms}, tenant=tenant)
            for tenant, index in jobs]


async def _offer(settings: Settings, job_type: str, load: Load) -> float:
    """A's flood while the workers are held, then their release and the quiet tenants'
    paced jobs; returns when the workers were released."""
    async with App(settings).client() as client:
        for first in range(0, load.flood, ENQUEUE_BATCH):
            size = min(ENQUEUE_BATCH, load.flood - first)
            await client.enqueue_many(tenant_jobs(job_type, [("a", 0)] * size, load.hold_ms))
        released = time.time()
        await throttle(settings, job_type, None)
        quiet = [(f"q{i}", i + 1) for i in range(load.quiet_tenants)]
        began = time.monotonic()
        for tick in range(int(load.quiet_s * load.quiet_rate_per_s)):
            # One job of each quiet tenant per tick, on a schedule that does not drift.
            await asyncio.sleep(max(0.0, began + tick / load.quiet_rate_per_s
                                    - time.monotonic()))
            await client.enqueue_many(tenant_jobs(job_type, quiet, load.hold_ms))
    return released


# -- the worker processes -------------------------------------------------------------------


def _start_workers(b: Bench, job_type: str, processes: int,
                   folder: Path) -> subprocess.Popen[bytes]:
    """`stream-jobs worker ... --processes N` of `job_type`, stamping into `folder`,
    returned once its group is Stable with every process in it."""
    (folder / "stamps").mkdir(parents=True, exist_ok=True)
    log_path = folder / "worker.log"
    argv = [str(PROJECT_CLI), "worker", "ops.bench.fair_app:app", "--type", job_type,
            "--processes", str(processes), "--log-level", "WARNING"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=CODE_DIR, env={**b.env(), STAMPS_ENV: str(
            folder / "stamps")}, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        wait_for_group(b.settings(), worker_group(b.prefix, job_type), processes, [proc],
                       [log_path])
    except BaseException:
        stop_sessions([proc], within_s=30)
        raise
    return proc


def _until_stamped(folder: Path, n: int, proc: subprocess.Popen[bytes],
                   timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (done := stamps_done(folder / "stamps")) < n:
        if proc.poll() is not None:
            raise BenchError(f"the workers exited with {proc.returncode} after {done} of {n} "
                             f"jobs: {log_tail(folder / 'worker.log')}")
        if time.monotonic() > deadline:
            raise BenchError(f"{done} of {n} jobs ran in {timeout_s:.0f} s")
        time.sleep(0.2)  # polling the stamp files: there is no event to wait on


def noisy_arm(b: Bench, job_type: str, load: Load, tag: str) -> dict[str, Any]:
    """One noisy-neighbour run of `job_type`: its figures and the load around it. The
    workers start held by the type's run-time throttle (as in the scaling run), so A's
    flood is all in the log, ahead of the quiet tenants, when they are released."""
    folder = b.out_dir / "fairness" / tag
    s = b.settings()
    run_async(throttle(s, job_type, HOLD_RATE_PER_S), 60)
    try:
        proc = _start_workers(b, job_type, load.processes, folder)
    except BaseException:
        run_async(throttle(s, job_type, None), 60)
        raise
    load_before = os.getloadavg()[0]
    try:
        released = run_async(_offer(s, job_type, load), 300)
        _until_stamped(folder, load.jobs, proc, 600)
    finally:
        stop_sessions([proc], within_s=30)
        run_async(throttle(s, job_type, None), 60)
    stamps = read_stamps(folder / "stamps")
    if len(stamps) != load.jobs:
        raise BenchError(f"{tag}: {len(stamps)} handler runs for {load.jobs} jobs")
    return {**noisy_run_figures(stamps, released), "tag": tag,
            "load_avg_before": load_before, "load_avg_after": os.getloadavg()[0]}


def limit_run(b: Bench, tenants: int = 4, per_tenant: int = 500,
              hold_ms: int = 20) -> dict[str, Any]:
    """The most of one tenant's jobs running at once on 3 processes under
    `tenant_concurrency = TENANT_LIMIT`, per tenant; or why it was not run."""
    if not limits_supported():
        return {"run": False, "why": NOT_RUN}
    s = b.settings()
    run_async(declare(s, FAIR_LIMIT, f"tenant_concurrency = {TENANT_LIMIT}\n"), 60)
    folder = b.out_dir / "fairness" / "limit"
    proc = _start_workers(b, FAIR_LIMIT, 3, folder)
    load_before = os.getloadavg()[0]
    jobs = [(f"t{i}", i + 1) for i in range(tenants) for _ in range(per_tenant)]

    async def send() -> None:
        async with App(s).client() as client:
            for first in range(0, len(jobs), ENQUEUE_BATCH):
                await client.enqueue_many(tenant_jobs(
                    FAIR_LIMIT, jobs[first:first + ENQUEUE_BATCH], hold_ms))

    try:
        run_async(send(), 120)
        _until_stamped(folder, len(jobs), proc, 300)
    finally:
        stop_sessions([proc], within_s=30)
    most = most_running_by_tenant(read_stamps(folder / "stamps"))
    return {"run": True, "limit": TENANT_LIMIT, "processes": 3, "jobs": len(jobs),
            "hold_ms": hold_ms, "most_running": {f"t{k - 1}": v for k, v in most.items()},
            "load_avg_before": load_before, "load_avg_after": os.getloadavg()[0]}


def fairness(b: Bench) -> None:
    began = time.monotonic()
    load = QUICK_LOAD if b.quick else Load()
    details: dict[str, Any] = {"load": vars(load) | {"jobs": load.jobs},
                               "load_avg_before": os.getloadavg()[0], "quick": b.quick,
                               "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                               "nproc": os.cpu_count(), "arms": []}
    b.results.details["fairness"] = details
    s = b.settings()
    run_async(declare(s, FAIR_ON, ""), 60)
    run_async(declare(s, FAIR_OFF, None), 60)
    arms = {"on": FAIR_ON, "off": FAIR_OFF}
    for run in range(1 if b.quick else NOISY_RUNS):
        for arm in rotated(list(arms), run):
            print(f"[bench] fairness noisy neighbour, [fairness] {arm}, run {run + 1}",
                  flush=True)
            details["arms"].append({**noisy_arm(b, arms[arm], load, f"{arm}-r{run}"),
                                    "arm": arm, "run": run + 1})
    _noisy_figures(b, details["arms"], load)
    try:
        details["limit"] = limit_run(b)
    except BenchError as exc:
        details["limit"] = {"run": False, "why": f"failed: {exc}"}
    if details["limit"]["run"]:
        b.results.add("fairness.tenant_max_running", "most jobs of one tenant running at once "
                      "(3 processes)", "jobs", [max(details["limit"]["most_running"].values())],
                      f"tenant_concurrency = {TENANT_LIMIT}, 4 tenants x 500 jobs of 20 ms")
    noop = noop_side_by_side(b)
    note = (f"{b.scale.backlog_n:,} jobs backlog, a type without [fairness], concurrency 64, "
            f"each drain in a process of its own; {len(noop.values['now'])} interleaved "
            "rounds")
    b.results.add("fairness.noop_now", "no-op, this code", "jobs/s", noop.values["now"], note,
                  loads=noop.loads["now"])
    b.results.add("fairness.noop_before", f"no-op, the code of {BEFORE_COMMIT} (before "
                  "issue 27)", "jobs/s", noop.values["before"], note,
                  loads=noop.loads["before"])
    details["load_avg_after"] = os.getloadavg()[0]
    details["took_s"] = round(time.monotonic() - began, 1)


def _noisy_figures(b: Bench, arms: list[dict[str, Any]], load: Load) -> None:
    note = (f"A: {load.flood:,} jobs, then {load.quiet_tenants} quiet tenants x "
            f"{load.quiet_rate_per_s:g}/s for {load.quiet_s:g} s; {load.hold_ms} ms handler, "
            f"{load.processes} processes")
    for arm in ("on", "off"):
        mine = [a for a in arms if a["arm"] == arm]
        with_ = "with" if arm == "on" else "without"
        add = b.results.add
        add(f"fairness.quiet_p50_{arm}", f"quiet tenants' dwell p50, {with_} [fairness]",
            "ms", [a["quiet_p50_ms"] for a in mine], note)
        add(f"fairness.quiet_p99_{arm}", f"quiet tenants' dwell p99, {with_} [fairness]",
            "ms", [a["quiet_p99_ms"] for a in mine], note)
        add(f"fairness.flood_s_{arm}", f"A's completion, {with_} [fairness]", "s",
            [a["flood_s"] for a in mine], "the workers' release to A's last job's end")
        add(f"fairness.throughput_{arm}", f"the type's throughput, {with_} [fairness]",
            "jobs/s", [a["throughput"] for a in mine],
            "jobs ended from the release to A's last end, over that time")
