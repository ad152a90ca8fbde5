"""What every bench section shares: the scale, the run's context, statistics, and its
topics (the jobs and backlogs a section drains: backlog.py; where the code under test
lives: snapshot.py).

A bench run owns its log: one fresh topic prefix (and Postgres schema) per `make bench`,
one job type (so topics and consumer groups) per section, and every topic under the
prefix is deleted at the end.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ops.bench.snapshot import CODE_DIR, REPO_DIR
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka.admin import admin_client
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import validate_job_type
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import toml_lines

PARTITIONS = 6
FETCH_RECORDS = 500

T = TypeVar("T")


class BenchError(Exception):
    """A section could not produce a trustworthy figure (wrong count, timeout, tool failure)."""


@dataclass(frozen=True)
class Scale:
    """How much each section does. Counts are jobs or records unless the name says otherwise."""

    runs: int
    kafka_tool_records: int
    kafka_e2e_messages: int
    produce_n: int
    awaited_n: int
    backlog_n: int
    once_n: int
    e2e_seconds: float
    mem_small: int
    mem_mid: int
    mem_big: int
    mem_big_runs: int
    retry_n: int
    peer_n: int
    profile_n: int
    # The scaling run: backlogs drained by 1, 2 and 4 worker processes, and its repeats.
    scaling_noop_n: int
    scaling_once_n: int
    scaling_runs: int
    # The schedules section: seconds each contender runs its two schedulers, per run.
    schedule_window_s: float


FULL = Scale(runs=3, kafka_tool_records=200_000, kafka_e2e_messages=1_500, produce_n=50_000,
             awaited_n=1_000, backlog_n=100_000, once_n=10_000, e2e_seconds=10.0,
             mem_small=10_000, mem_mid=100_000, mem_big=1_000_000, mem_big_runs=1,
             retry_n=200, peer_n=6_000, profile_n=30_000, scaling_noop_n=60_000,
             scaling_once_n=8_000, scaling_runs=3, schedule_window_s=30.0)
QUICK = Scale(runs=1, kafka_tool_records=50_000, kafka_e2e_messages=300, produce_n=5_000,
              awaited_n=100, backlog_n=5_000, once_n=1_000, e2e_seconds=4.0,
              mem_small=1_000, mem_mid=3_000, mem_big=10_000, mem_big_runs=1, retry_n=20,
              peer_n=1_000, profile_n=3_000, scaling_noop_n=20_000, scaling_once_n=3_000,
              scaling_runs=1, schedule_window_s=8.0)


# -- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile `q` (0-100) of `values`."""
    if not values:
        raise BenchError("no samples to take a percentile of")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Figure:
    """One measured quantity over the runs: the median and the spread (min-max); for the
    arms of an interleaved measurement (ops/bench/paired.py), the 1-minute load average
    after each value."""

    name: str
    label: str
    unit: str
    values: list[float]
    note: str = ""
    median: float = 0.0
    low: float = 0.0
    high: float = 0.0
    loads: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.values:
            raise BenchError(f"{self.name}: no values")
        self.median = statistics.median(self.values)
        self.low = min(self.values)
        self.high = max(self.values)


@dataclass
class Results:
    """Everything a run collects; written to `out/results*.json`, rendered to RESULTS.md."""

    meta: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, label: str, unit: str, values: Iterable[float],
            note: str = "", loads: Iterable[float] = ()) -> Figure:
        figure = Figure(name, label, unit, [float(v) for v in values], note,
                        loads=[float(v) for v in loads])
        self.figures[name] = figure
        return figure

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "figures": {k: asdict(v) for k, v in self.figures.items()},
                "details": self.details, "errors": self.errors, "timings_s": self.timings_s}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")


def rotated(items: Sequence[T], run: int) -> list[T]:
    """`items` rotated by `run`: side-by-side measurements do not always go in one order."""
    k = run % len(items)
    return [*items[k:], *items[:k]]



class Tally:
    """Counts handler calls and stamps the first and the last (perf_counter seconds)."""

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0

    def hit(self) -> None:
        now = time.perf_counter()
        if self.count == 0:
            self.first = now
        self.count += 1
        self.last = now

    def rate(self) -> float:
        """Jobs per second from the first call to the last."""
        if self.count < 2 or self.last <= self.first:
            raise BenchError(f"too few handler calls ({self.count}) to time")
        return (self.count - 1) / (self.last - self.first)


# -- the run's context ----------------------------------------------------------------------


@dataclass
class Bench:
    """One `make bench`: its scale, its prefix, where it writes, and what it has measured."""

    scale: Scale
    quick: bool
    prefix: str
    out_dir: Path
    base: Settings
    results: Results

    @property
    def topics_dir(self) -> Path:
        return self.out_dir / "topics"

    def stack_settings(self) -> Settings:
        """The bench's settings with the stack folder anchored at the checkout (the bench
        runs from a snapshot, so a relative `STREAM_JOBS_STACK_DIR` would point into it)."""
        folder = self.base.stack_dir
        return self.base.model_copy(update={"stack_dir": folder if folder.is_absolute()
                                            else REPO_DIR / folder})

    def settings(self, prefix: str | None = None) -> Settings:
        """Settings on this run's prefix, topics folder and Postgres schema."""
        return self.base.model_copy(update={
            "topic_prefix": prefix or self.prefix,
            "topics_dir": self.topics_dir,
            "database_schema": self.prefix,
        })

    def env(self, prefix: str | None = None) -> dict[str, str]:
        """The environment for a subprocess (worker, pacer) on the same settings."""
        s = self.settings(prefix)
        return {**os.environ,
                "STREAM_JOBS_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
                "STREAM_JOBS_DATABASE_URL": s.database_url,
                "STREAM_JOBS_DATABASE_SCHEMA": s.database_schema,
                "STREAM_JOBS_TOPIC_PREFIX": s.topic_prefix,
                "STREAM_JOBS_TOPICS_DIR": str(s.topics_dir),
                "PYTHONPATH": str(CODE_DIR)}

    async def declare(self, job_type: str, *, prefix: str | None = None,
                      **keys: object) -> JobTypePolicy:
        """Write topics/<type>.toml (6 partitions, one 5 s tier) and make Kafka match."""
        validate_job_type(job_type)  # a bad name must not leave a file that breaks the folder
        return await declare_one(self.settings(prefix), job_type, **{
            "partitions": PARTITIONS, "retry_tiers": ["5s"], "max_attempts": 2,
            "retention": "2h", **keys})


async def declare_one(settings: Settings, job_type: str, **keys: object) -> JobTypePolicy:
    """topics/<type>.toml in the settings' folder, and Kafka made to match for this type
    only (`stream_jobs.testing.stack.declare_type` applies the whole folder, and a bench
    folder holds a type per section)."""
    settings.topics_dir.mkdir(parents=True, exist_ok=True)
    (settings.topics_dir / f"{job_type}.toml").write_text(toml_lines(keys))
    types = load_job_types(settings.topics_dir)
    await apply(settings, {job_type: types[job_type]})
    return types[job_type]



async def delete_topics(settings: Settings, prefix: str) -> int:
    """Delete every topic named `prefix...` (this run's only); returns how many."""
    async with admin_client(settings) as admin:
        names = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if names:
            await admin.delete_topics(names)
    return len(names)


def stop_sessions(procs: Sequence[subprocess.Popen[bytes]], within_s: float) -> None:
    """SIGTERM each process still running, to its whole process group (each was started in
    a session of its own), then SIGKILL the groups of those not gone within `within_s`."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=within_s)


def run_async(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run a section's coroutine on a fresh event loop, bounded by `timeout_s`: uvloop where
    it is installed, as `stream-jobs worker` runs (and the raw baselines run on the same)."""
    bounded = asyncio.wait_for(coro, timeout_s)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(bounded)
    return uvloop.run(bounded)


def event_loop_name() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio default loop"
    return f"uvloop {getattr(uvloop, '__version__', 'unknown')}"  # not in uvloop's stubs
