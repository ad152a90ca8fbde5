"""The scaling run: how processing throughput grows with worker processes.

1, 2 and 4 `stream-jobs worker` processes of one job type drain a backlog on a
12-partition topic, with a no-op handler and with an exactly-once one (an effect row
through `ctx.once()`), on the single broker of the stack and on the three-node cluster
(`stream-jobs dev up --brokers 3`: replication factor 3, min.insync.replicas 2). The
section starts the cluster when it is not running and stops it afterwards if it did.

Per point: the backlog is filled once per broker setup and job type, and each run drains
it again (the worker group is rewound to 0; the exactly-once tables are truncated).

The N processes start while the type is held by its own run-time throttle (`stream-jobs
throttle`, a near-zero rate through the control topic), so none drains the backlog alone
while the others still start; once the consumer group is Stable with N members the
throttle is reset, and every process starts working within a fraction of a second.
Every finished job is stamped (`ops.bench.scaling_app`); the rate is taken over the
**steady window**, from the moment the last process finished its first job after the
release to the moment the first process finished its last one (so every process still
had work). CPU time of the workers, the broker(s), Postgres and the whole machine is
sampled during the run and cut to the same window.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError

from ops.bench.backlog import fill, rewind_worker_group
from ops.bench.common import (
    Bench,
    BenchError,
    declare_one,
    delete_topics,
    rotated,
    run_async,
    stop_sessions,
)
from ops.bench.cpu import machine_busy_s, postgres_cpu_s, process_cpu_s
from ops.bench.ours import effects_count, prepare_effects
from ops.bench.scaling_app import NOOP_TYPE, ONCE_TYPE, STAMPS_ENV, read_stamps
from ops.bench.snapshot import CODE_DIR, PROJECT_CLI
from stream_jobs.errors import PortInUse
from stream_jobs.kafka.admin import group_state
from stream_jobs.naming import worker_group
from stream_jobs.runtime.throttle import publish_rate
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer

PARTITIONS = 12
PROCESS_COUNTS = (1, 2, 4)
HANDLERS = {"noop": NOOP_TYPE, "once": ONCE_TYPE}
BROKER_SETUPS = (1, 3)
# BENCH_SCALING_BROKERS=1 skips the three-node cluster (e.g. where it cannot run).
BROKERS_ENV = "BENCH_SCALING_BROKERS"
SAMPLE_S = 0.5
JOIN_TIMEOUT_S = 180.0
# The rate that holds the workers while they start: one job per process (a fresh token
# bucket holds one token), then nothing for 1,000 s.
HOLD_RATE_PER_S = 0.001
# Its section of RESULTS.md (ops/bench/report/scaling.py). No goals: how throughput grows
# with processes on a shared 2-core box is described, not judged against a target.
HEADING = "Scaling"
GOALS: list[tuple[str, str, str | None, str, float, str]] = []


# -- pure: the steady window and the CPU in it ----------------------------------------------


@dataclass(frozen=True)
class Steady:
    """The rates of one drain by N processes, from their completion stamps."""

    rate: float  # jobs/s in the steady window
    first_to_last_rate: float  # jobs/s from the first completion to the last (any process)
    window_start: float
    window_end: float
    jobs_in_window: int
    jobs: int

    @property
    def window_s(self) -> float:
        return self.window_end - self.window_start


def steady_window(all_stamps: Sequence[Sequence[float]], since: float = 0.0) -> Steady:
    """The steady window of N processes' completion stamps (one sorted list per process),
    counting only the jobs finished after `since` (the release).

    It runs from the latest first completion to the earliest last completion: every
    process has joined and worked in it, and none had run out of work. Jobs finished at
    the window's start are not counted (the window opens on them), those at its end are.
    `jobs` counts every stamp, before the release too.
    """
    if not all_stamps:
        raise BenchError("no worker process reported")
    stamps = [[t for t in own if t > since] for own in all_stamps]
    for index, own in enumerate(stamps):
        if not own:
            raise BenchError(f"worker process {index + 1} of {len(stamps)} ran no job")
    start = max(own[0] for own in stamps)
    end = min(own[-1] for own in stamps)
    if end <= start:
        raise BenchError("the processes never all worked at once: one finished before "
                         "another started; use a bigger backlog")
    inside = sum(1 for own in stamps for t in own if start < t <= end)
    first = min(own[0] for own in stamps)
    last = max(own[-1] for own in stamps)
    released = sum(len(own) for own in stamps)
    return Steady(rate=inside / (end - start),
                  first_to_last_rate=(released - 1) / (last - first),
                  window_start=start, window_end=end, jobs_in_window=inside,
                  jobs=sum(len(own) for own in all_stamps))


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one moment (monotonic clock)."""

    at: float
    workers: float
    brokers: float
    postgres: float
    machine: float  # every process on the box, ours and everyone else's


def _value_at(samples: Sequence[CpuSample], field: str, at: float) -> float:
    """A cumulative series, linearly interpolated at `at` (clamped to the samples)."""
    if at <= samples[0].at:
        return float(getattr(samples[0], field))
    for before, after in itertools.pairwise(samples):
        if before.at <= at <= after.at:
            low, high = float(getattr(before, field)), float(getattr(after, field))
            share = (at - before.at) / (after.at - before.at) if after.at > before.at else 1.0
            return low + (high - low) * share
    return float(getattr(samples[-1], field))


def cores_in_window(samples: Sequence[CpuSample], start: float, end: float) -> dict[str, float]:
    """Average cores busy between `start` and `end`, for each part and the whole machine."""
    if len(samples) < 2 or end <= start:
        raise BenchError("too few CPU samples to cover the steady window")
    return {field: (_value_at(samples, field, end) - _value_at(samples, field, start))
            / (end - start) for field in ("workers", "brokers", "postgres", "machine")}


def broker_setups(text: str) -> list[int]:
    """The broker setups to measure from BENCH_SCALING_BROKERS ("1,3"; empty: both)."""
    if not text.strip():
        return list(BROKER_SETUPS)
    found = []
    for part in text.split(","):
        if part.strip() not in ("1", "3"):
            raise BenchError(f"{BROKERS_ENV}={text!r}: give 1, 3 or 1,3")
        found.append(int(part))
    return sorted(set(found))


def parse_outcomes(log_text: str) -> dict[str, int]:
    """The outcome counts of a worker process's last "stopped: succeeded 10, ..." line."""
    for line in reversed(log_text.splitlines()):
        if line.startswith("stopped:"):
            found: dict[str, int] = {}
            for part in line.removeprefix("stopped:").split(","):
                name, _, count = part.strip().rpartition(" ")
                if name and count.isdigit():
                    found[name] = int(count)
            return found
    return {}


# -- I/O: CPU from /proc --------------------------------------------------------------------


@dataclass(frozen=True)
class Services:
    """The pids whose CPU a run counts besides its workers."""

    brokers: list[int]
    postmaster: int | None

    def sample(self, workers: Sequence[int]) -> CpuSample:
        return CpuSample(at=time.monotonic(),
                         workers=sum(process_cpu_s(p) for p in workers),
                         brokers=sum(process_cpu_s(p) for p in self.brokers),
                         postgres=postgres_cpu_s(self.postmaster), machine=machine_busy_s())


# -- I/O: a broker setup, its topics and its backlogs ---------------------------------------


@dataclass(frozen=True)
class Setup:
    """One broker setup: its Kafka, its own prefix and topics folder, its services' pids."""

    brokers: int
    settings: Settings
    services: Services

    def env(self, b: Bench) -> dict[str, str]:
        return {**b.env(self.settings.topic_prefix),
                "STREAM_JOBS_KAFKA_BOOTSTRAP": self.settings.kafka_bootstrap,
                "STREAM_JOBS_TOPICS_DIR": str(self.settings.topics_dir)}


async def declare(settings: Settings, job_type: str, replication: int) -> None:
    """topics/<type>.toml with 12 partitions in the setup's folder, and Kafka made to match."""
    await declare_one(settings, job_type, partitions=PARTITIONS,
                      replication_factor=replication, retry_tiers=["5s"], max_attempts=2,
                      retention="2h")


def start_cluster(kafka: KafkaCluster, attempts: int = 5) -> None:
    """`kafka.up()`, again after a pause if a port was taken: a cluster port inside the
    kernel's ephemeral range (32768-60999) can be held for a moment by any outgoing
    connection on the box."""
    for attempt in range(1, attempts + 1):
        try:
            kafka.up()
            return
        except PortInUse as exc:
            kafka.down()
            if attempt == attempts:
                raise BenchError(f"the cluster could not start: {exc}") from exc
            print(f"[bench] scaling: {exc}; trying again in 15 s", flush=True)
            time.sleep(15)  # for a short-lived connection to let the port go


def _setup(b: Bench, brokers: int, kafka: KafkaCluster) -> Setup:
    prefix = f"{b.prefix}-s{brokers}"
    settings = b.settings(prefix).model_copy(update={
        "kafka_bootstrap": kafka.bootstrap,
        "topics_dir": b.out_dir / f"topics-scaling-{brokers}"})
    brokers_pids = [row.pid for row in kafka.status() if row.pid is not None]
    postmaster = PostgresServer(b.stack_settings()).running_pid()
    return Setup(brokers, settings, Services(brokers_pids, postmaster))


# -- I/O: one point: N worker processes draining one backlog --------------------------------


def wait_for_group(settings: Settings, group: str, members: int,
                    procs: Sequence[subprocess.Popen[bytes]], logs: Sequence[Path]) -> None:
    """Return once `group` is Stable with `members` members (every partition assigned)."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    state, count = "", 0
    while time.monotonic() < deadline:
        for index, proc in enumerate(procs):
            if proc.poll() is not None:
                raise BenchError(f"worker process {index + 1} exited with {proc.returncode} "
                                 f"before the group formed: {log_tail(logs[index])}")
        try:
            state, count = run_async(group_state(settings, group), 30)
        except KafkaError as exc:  # e.g. no coordinator yet on a cluster just started
            state, count = type(exc).__name__, 0
        if state == "Stable" and count == members:
            return
        time.sleep(0.2)  # polling the coordinator: there is no event to wait on
    raise BenchError(f"group {group} was {state} with {count} of {members} members after "
                     f"{JOIN_TIMEOUT_S:.0f} s")


async def throttle(settings: Settings, job_type: str, rate_per_s: float | None) -> None:
    """Hold the type at `rate_per_s`, or (None) reset it to its TOML (no limit)."""
    await publish_rate(settings, job_type, rate_per_s, at_ms=int(time.time() * 1000),
                       reset=rate_per_s is None)


def log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-600:] if path.is_file() else "(no log)"


def drain_with_processes(b: Bench, setup: Setup, handler: str, processes: int, n: int,
                         tag: str) -> dict[str, Any]:
    """Start `processes` workers under a hold, release them together once they form the
    group, and wait until each exits (`--until-idle`): the steady rate, the CPU in its
    window, and the outcomes."""
    s = setup.settings
    job_type = HANDLERS[handler]
    folder = b.out_dir / "scaling" / tag
    folder.mkdir(parents=True, exist_ok=True)
    argv = [str(PROJECT_CLI), "worker", "ops.bench.scaling_app:app", "--type", job_type,
            "--until-idle", "--log-level", "WARNING"]
    log_paths = [folder / f"worker-{index}.log" for index in range(processes)]
    stamp_paths = [folder / f"worker-{index}.stamps" for index in range(processes)]
    procs: list[subprocess.Popen[bytes]] = []
    timeout_s = 120 + n / 200
    run_async(throttle(s, job_type, HOLD_RATE_PER_S), 60)
    try:
        for log_path, stamp_path in zip(log_paths, stamp_paths, strict=True):
            with log_path.open("wb") as log:
                procs.append(subprocess.Popen(argv, cwd=CODE_DIR,
                                              env={**setup.env(b), STAMPS_ENV: str(stamp_path)},
                                              stdout=subprocess.DEVNULL, stderr=log,
                                              start_new_session=True))
        wait_for_group(s, worker_group(s.topic_prefix, job_type), processes, procs, log_paths)
        samples = [setup.services.sample([p.pid for p in procs])]
        released = samples[0].at
        run_async(throttle(s, job_type, None), 60)
        while any(proc.poll() is None for proc in procs):
            if time.monotonic() - released > timeout_s:
                raise BenchError(f"{processes} workers did not drain {n:,} {handler} jobs "
                                 f"in {timeout_s:.0f} s")
            time.sleep(SAMPLE_S)  # a sampling period, not a wait for a condition
            samples.append(setup.services.sample([p.pid for p in procs]))
    finally:
        stop_sessions(procs, within_s=30)
        run_async(throttle(s, job_type, None), 60)
    outcomes: dict[str, int] = {}
    stamps: list[list[float]] = []
    for index, proc in enumerate(procs):
        if proc.returncode != 0 or not stamp_paths[index].is_file():
            raise BenchError(f"worker process {index + 1} exited with {proc.returncode}: "
                             f"{log_tail(log_paths[index])}")
        for name, count in parse_outcomes(log_paths[index].read_text(errors="replace")).items():
            outcomes[name] = outcomes.get(name, 0) + count
        stamps.append(sorted(read_stamps(stamp_paths[index])))
    steady = steady_window(stamps, since=released)
    if steady.jobs < n:
        raise BenchError(f"{processes} workers ran {steady.jobs} of {n} {handler} jobs "
                         f"(outcomes {outcomes})")
    cores = cores_in_window(samples, steady.window_start, steady.window_end)
    return {"brokers": setup.brokers, "handler": handler, "processes": processes, "n": n,
            **asdict(steady), "window_s": steady.window_s,
            "release_to_first_s": min(t for own in stamps for t in own if t > released)
            - released,
            "wall_s": samples[-1].at - released,
            "per_process_jobs": [len(own) for own in stamps], "outcomes": outcomes,
            "cores": cores}


# -- the section ----------------------------------------------------------------------------


def _drain_point(b: Bench, setup: Setup, handler: str, processes: int, n: int,
                 tag: str) -> dict[str, Any]:
    s = setup.settings
    if handler == "once":
        run_async(prepare_effects(s, truncate=True), 60)
    result = drain_with_processes(b, setup, handler, processes, n, tag)
    if handler == "once":
        distinct, total = run_async(effects_count(s), 60)
        if distinct != n or total != n:
            raise BenchError(f"exactly-once with {processes} processes: {total} effect rows "
                             f"for {distinct} of {n} jobs")
    run_async(rewind_worker_group(s, HANDLERS[handler]), 120)
    return result


def _measure_setup(b: Bench, setup: Setup, sizes: dict[str, int],
                   runs: list[dict[str, Any]]) -> None:
    """Fill the setup's two backlogs, then drain each with 1, 2 and 4 processes, repeated;
    each result is appended to `runs` as it comes (a failure keeps the ones before it)."""
    s = setup.settings
    fills: dict[str, float] = {}
    for handler, job_type in HANDLERS.items():
        run_async(declare(s, job_type, setup.brokers), 120)
        fills[handler] = run_async(fill(s, job_type, sizes[handler]), 60 + sizes[handler] / 200)
    b.results.details["scaling"].setdefault("fill_jobs_per_s", {})[str(setup.brokers)] = fills
    for run in range(b.scale.scaling_runs):
        for handler in rotated(list(HANDLERS), run):
            for processes in rotated(list(PROCESS_COUNTS), run):
                tag = f"b{setup.brokers}-{handler}-p{processes}-r{run}"
                print(f"[bench] scaling {tag}", flush=True)
                result = _drain_point(b, setup, handler, processes, sizes[handler], tag)
                runs.append({**result, "repeat": run})


def run_details(b: Bench, runs: list[dict[str, Any]], **sizes: object) -> dict[str, Any]:
    """What a run of worker processes (this section's, or the processes section's) says of
    itself in results.json: when, how big, how often, on how many cores and how busy,
    and its `runs` as they come."""
    return {"measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "partitions": PARTITIONS,
            **sizes, "repeats": b.scale.scaling_runs, "quick": b.quick,
            "nproc": os.cpu_count(), "load_avg_before": os.getloadavg()[0], "runs": runs}


def scaling(b: Bench) -> None:
    began = time.monotonic()
    sizes = {"noop": b.scale.scaling_noop_n, "once": b.scale.scaling_once_n}
    runs: list[dict[str, Any]] = []
    details = b.results.details["scaling"] = run_details(b, runs, backlogs=sizes)
    run_async(prepare_effects(b.settings(), truncate=True), 60)
    base = b.stack_settings()
    setups = broker_setups(os.environ.get(BROKERS_ENV, ""))
    details["broker_setups"] = setups
    for brokers in setups:
        kafka = KafkaCluster(base, brokers)
        # By pid, not by port: a busy broker can miss the port probe and read as stopped.
        started = not all(row.pid is not None for row in kafka.status())
        if started and brokers == 1:
            raise BenchError(f"the stack's broker on {kafka.bootstrap} is not running")
        details[f"cluster_started_by_bench_{brokers}"] = started
        try:
            if started:
                print(f"[bench] scaling: starting the 3-node cluster on {kafka.bootstrap}",
                      flush=True)
                start_cluster(kafka)
            setup = _setup(b, brokers, kafka)
            try:
                _measure_setup(b, setup, sizes, runs)
            finally:
                run_async(delete_topics(setup.settings, setup.settings.topic_prefix), 120)
        finally:
            if started:
                kafka.down()
    details["load_avg_after"] = os.getloadavg()[0]
    details["took_s"] = round(time.monotonic() - began, 1)
    for brokers in setups:
        for handler in HANDLERS:
            for processes in PROCESS_COUNTS:
                point = (brokers, handler, processes)
                rates = [r["rate"] for r in runs
                         if (r["brokers"], r["handler"], r["processes"]) == point]
                b.results.add(f"scaling.b{brokers}.{handler}.p{processes}",
                              f"{handler}, {processes} process(es), {brokers} broker(s)",
                              "jobs/s", rates, "steady window; see the Scaling section")
