"""Samplers that run beside the workers: effect rows over time (throughput), the
worker group's committed offsets over time (for the commit check), and the workers' peak
resident memory. Both keep going
through faults: a sample that cannot be taken (Postgres or a broker down) is skipped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import asyncpg

from ops.chaos.app import EFFECTS_TABLE
from ops.chaos.evidence import CommitSample
from ops.chaos.faults import until
from ops.chaos.workers import WorkerGroup
from stream_jobs.kafka.admin import admin_client, group_state
from stream_jobs.naming import worker_group
from stream_jobs.settings import Settings

log = logging.getLogger("ops.chaos")


class Throughput:
    """`(epoch s, effect rows)` every `interval_s`."""

    def __init__(self, settings: Settings, interval_s: float = 0.25) -> None:
        self.settings = settings
        self.interval_s = interval_s
        self.series: list[tuple[float, int]] = []

    @property
    def latest(self) -> int:
        return self.series[-1][1] if self.series else 0

    async def run(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            while True:
                try:
                    if conn is None or conn.is_closed():
                        conn = await asyncpg.connect(
                            self.settings.database_url, timeout=2,
                            server_settings={"search_path": self.settings.database_schema})
                    n = await conn.fetchval(f"SELECT count(*) FROM {EFFECTS_TABLE}", timeout=2)
                    self.series.append((time.time(), int(n)))
                except Exception:  # Postgres down or restarting: skip this sample
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            conn.terminate()
                    conn = None
                await asyncio.sleep(self.interval_s)  # a sampling period, not a wait
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)


class Memory:
    """The highest resident set size (MB) any live worker of `group` reached, sampled
    every `interval_s` from /proc."""

    def __init__(self, group: WorkerGroup, interval_s: float = 0.5) -> None:
        self.group = group
        self.interval_s = interval_s
        self.peak_mb: float | None = None

    async def run(self) -> None:
        while True:
            for worker in self.group.live():
                mb = rss_mb(worker.pid)
                if mb is not None and (self.peak_mb is None or mb > self.peak_mb):
                    self.peak_mb = mb
            await asyncio.sleep(self.interval_s)  # a sampling period, not a wait


def rss_mb(pid: int) -> float | None:
    """A process's resident set (VmRSS) in MB; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


class Commits:
    """The worker group's committed lane offsets every `interval_s`."""

    def __init__(self, settings: Settings, group: str, topic: str,
                 interval_s: float = 0.5) -> None:
        self.settings = settings
        self.group = group
        self.topic = topic
        self.interval_s = interval_s
        self.samples: list[CommitSample] = []

    async def run(self) -> None:
        while True:
            try:
                async with admin_client(self.settings) as admin:
                    while True:
                        offsets = await asyncio.wait_for(
                            admin.list_consumer_group_offsets(self.group), timeout=5)
                        # The time is taken after the answer: the commits were made before.
                        self.samples.append(CommitSample(time.time(), {
                            tp.partition: meta.offset for tp, meta in offsets.items()
                            if tp.topic == self.topic and meta.offset >= 0}))
                        await asyncio.sleep(self.interval_s)  # a sampling period
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broker fault: start a fresh admin client
                log.debug("commit sample failed: %s", exc)
                await asyncio.sleep(self.interval_s)


async def group_size(settings: Settings, job_type: str) -> tuple[str, int]:
    """(state, members) of the type's worker group."""
    return await group_state(settings, worker_group(settings.topic_prefix, job_type))


async def group_stable(settings: Settings, job_type: str, members: int,
                       within_s: float) -> None:
    """Return once the worker group is Stable with `members` members."""

    async def settled() -> bool:
        return await group_size(settings, job_type) == ("Stable", members)

    await until(settled, within_s, f"the worker group to be stable with {members} members")
