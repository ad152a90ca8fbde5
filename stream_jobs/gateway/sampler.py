"""The gateway's view of the queues over time: stats sampled in the background.

Every `interval_s` the sampler takes a `stream_jobs.tools.stats` snapshot of every declared
type (per partition, for the partition metrics) and keeps a small point per type in a
ring that covers the last hour. `/metrics` and the dashboard read the latest snapshot;
the dashboard's lag chart reads the ring. For each type with `[fairness]` it also takes a
tenant census (`stream_jobs.fairness.census`, at most `TENANT_SCAN_RECORDS` records read
per type and sample), which `/metrics` exports by tenant. Nothing is persisted: a restarted gateway
starts that chart afresh (the other charts read the history: `recent.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from stream_jobs.dlq.census import DlqCensus
from stream_jobs.errors import StreamJobsError
from stream_jobs.fairness.census import TenantCensus
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.redaction import redact_text
from stream_jobs.settings import Settings
from stream_jobs.tools.stats import collect
from stream_jobs.tools.tenant_stats import collect_tenants
from stream_jobs.tools.type_stats import StatsSnapshot, TypeStats

log = logging.getLogger("stream_jobs.gateway")

HISTORY_S = 3600.0
RATE_WINDOW_S = 60.0
# A sample's scan of one type's waiting jobs by tenant: a bound, not a page of the backlog.
TENANT_SCAN_RECORDS = 20_000


@dataclass(frozen=True)
class TypePoint:
    """One type at one sample: what the charts draw."""

    lag: int
    oldest_age_s: float | None
    dlq_depth: int | None
    done_per_s: float
    failed_per_s: float  # retried + dead-lettered
    failure_ratio: float | None  # failed / (done + failed); None with nothing finished

    @classmethod
    def of(cls, stats: TypeStats) -> TypePoint:
        per_s = stats.rates.per_s()
        done, failed = per_s["done"], per_s["retried"] + per_s["dead_lettered"]
        total = done + failed
        return cls(stats.lag, stats.oldest_age_s, stats.dlq_depth, done, failed,
                   failed / total if total > 0 else None)


@dataclass(frozen=True)
class Sample:
    at_ms: int
    types: dict[str, TypePoint]


class StatsSampler:
    """Samples stats every `interval_s` into `latest` and a ring of `Sample`s."""

    def __init__(self, settings: Settings, types: Mapping[str, JobTypePolicy], *,
                 interval_s: float, window_s: float = RATE_WINDOW_S,
                 history_s: float = HISTORY_S) -> None:
        self.settings = settings
        self.types = dict(types)
        self.interval_s = interval_s
        self.window_s = window_s
        self.history: deque[Sample] = deque(maxlen=max(2, int(history_s / interval_s) + 1))
        self.latest: StatsSnapshot | None = None
        self.tenants: dict[str, TenantCensus] = {}  # of the types with [fairness]
        self.census = DlqCensus()  # each sample reads only the letters dead-lettered since
        self.problem: str | None = None  # why the last sample failed, if it did
        self.sampled = asyncio.Event()  # set after the first sample, good or bad

    async def sample_once(self) -> StatsSnapshot | None:
        if not self.types:
            self.sampled.set()
            return None
        try:
            snapshot = await collect(self.settings, self.types, per_partition=True,
                                     window_s=self.window_s, census=self.census)
            tenants = {name: await collect_tenants(self.settings, self.types, name,
                                                   window_s=self.window_s,
                                                   max_records=TENANT_SCAN_RECORDS)
                       for name, policy in sorted(self.types.items())
                       if policy.fairness is not None}
        except StreamJobsError as exc:
            self.problem = redact_text(str(exc), self.settings)
            log.warning("stats not sampled: %s", self.problem)
            return None
        except Exception as exc:  # a driver error we do not wrap must not end the sampling
            # Shown on the overview page and in /healthz: a driver's message may quote the
            # database URL, so the traceback (whose last line is that message) is not logged.
            self.problem = redact_text(f"{type(exc).__name__}: {exc}", self.settings)
            log.error("stats not sampled: %s", self.problem)
            return None
        finally:
            self.sampled.set()
        self.problem = None
        self.latest = snapshot
        self.tenants = tenants
        self.history.append(Sample(snapshot.at_ms,
                                   {t.job_type: TypePoint.of(t) for t in snapshot.types}))
        return snapshot

    async def run(self) -> None:
        """Sample until cancelled, on a fixed schedule."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            await self.sample_once()
            due = max(due + self.interval_s, loop.time())
            await asyncio.sleep(due - loop.time())  # a period, not a wait for a condition

    def series(self, job_type: str) -> list[tuple[int, TypePoint]]:
        """(sample time in ms, point) of one type over the last hour, oldest first."""
        return [(s.at_ms, s.types[job_type]) for s in self.history if job_type in s.types]


__all__ = ["TENANT_SCAN_RECORDS", "Sample", "StatsSampler", "TypePoint"]
