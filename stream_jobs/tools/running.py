"""What runs now, and the worker processes running it, as the live workers' latest
reports tell (`stream-jobs running`, `stream-jobs workers`, `/ui/running`, `/ui/workers`).

Pure: `stream_jobs.tools.worker_reports` reads the reports. A worker is live while its
latest report is not its final one and is younger than ALIVE_INTERVALS of its own report
interval (`alive_workers`, as `stream-jobs stats` judges). Each report lists the oldest
jobs in its worker's handlers (up to `RUNNING_SHOWN`) and counts them all; a job shown
here may have ended since its worker's report, which is at most one report interval old.
A process that runs several types publishes one report per type (one worker each): the
workers' view joins them by host and pid.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stream_jobs.runtime.reports import RunningJob, WorkerReport
from stream_jobs.tools.type_stats import DEFAULT_REPORT_INTERVAL_S, alive_workers


@dataclass(frozen=True)
class RunningRow:
    """One job in a live worker's handler."""

    job: RunningJob
    job_type: str
    worker_id: str

    def running_for_s(self, now_ms: int) -> float:
        return max(0.0, (now_ms - self.job.started_at_ms) / 1000)

    def to_dict(self, now_ms: int) -> dict[str, Any]:
        job = self.job
        return {"job_id": job.job_id, "job_type": self.job_type, "attempt": job.attempt,
                "worker_id": self.worker_id, "topic": job.topic, "partition": job.partition,
                "offset": job.offset, "started_at_ms": job.started_at_ms,
                "running_for_s": round(self.running_for_s(now_ms), 3)}


@dataclass(frozen=True)
class WorkerProcess:
    """One live worker process: its workers' latest reports (one per type it runs)."""

    reports: tuple[WorkerReport, ...]

    @property
    def key(self) -> str:
        """Host and pid, or the worker ID of a report too old to say them."""
        first = self.reports[0]
        return f"{first.host}:{first.pid}" if first.host else first.worker_id

    @property
    def host(self) -> str:
        return self.reports[0].host

    @property
    def pid(self) -> int:
        return self.reports[0].pid

    @property
    def version(self) -> str:
        return self.reports[0].version

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(sorted({r.job_type for r in self.reports}))

    @property
    def partitions(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted({tp for r in self.reports for tp in r.partitions}))

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.reports)

    @property
    def running_count(self) -> int:
        return sum(r.running_count for r in self.reports)

    @property
    def last_report_ms(self) -> int:
        return max(r.at_ms for r in self.reports)

    def report_age_s(self, now_ms: int) -> float:
        """How old this process's latest report is at `now_ms`."""
        return max(0, now_ms - self.last_report_ms) / 1000

    @property
    def oldest(self) -> RunningRow | None:
        """The job in this process's handlers that started first."""
        rows = [RunningRow(job, r.job_type, r.worker_id)
                for r in self.reports for job in r.running[:1]]
        return min(rows, key=lambda row: row.job.started_at_ms, default=None)

    def to_dict(self, now_ms: int) -> dict[str, Any]:
        oldest = self.oldest
        return {"host": self.host, "pid": self.pid, "worker_ids": [r.worker_id
                                                                  for r in self.reports],
                "types": list(self.types), "partitions": [list(tp) for tp in self.partitions],
                "in_flight": self.in_flight, "running": self.running_count,
                "oldest": None if oldest is None else oldest.to_dict(now_ms),
                "last_report_age_s": round(self.report_age_s(now_ms), 3),
                "version": self.version}


@dataclass(frozen=True)
class RunningView:
    """The live workers' latest reports at `at_ms` (of one type, or of all)."""

    at_ms: int
    workers: tuple[WorkerReport, ...]
    job_type: str | None = None

    @property
    def jobs(self) -> list[RunningRow]:
        """Every running job the reports list, longest running first."""
        rows = [RunningRow(job, r.job_type, r.worker_id) for r in self.workers
                for job in r.running]
        return sorted(rows, key=lambda row: (row.job.started_at_ms, row.job.job_id))

    @property
    def running_count(self) -> int:
        """Jobs running, as the reports count them (listed or not)."""
        return sum(r.running_count for r in self.workers)

    @property
    def unlisted(self) -> int:
        """Running jobs past each report's cap, counted but not listed."""
        return sum(max(0, r.running_count - len(r.running)) for r in self.workers)

    @property
    def processes(self) -> list[WorkerProcess]:
        """The live worker processes, by host and pid."""
        by_process: dict[str, list[WorkerReport]] = {}
        for report in self.workers:
            key = f"{report.host}:{report.pid}" if report.host else report.worker_id
            by_process.setdefault(key, []).append(report)
        return [WorkerProcess(tuple(own)) for _, own in sorted(by_process.items())]

    def report_age_s(self) -> tuple[float, float] | None:
        """How old the freshest and the stalest report read are, or None without any."""
        if not self.workers:
            return None
        ages = [max(0, self.at_ms - r.at_ms) / 1000 for r in self.workers]
        return min(ages), max(ages)

    def find(self, job_id: str) -> RunningRow | None:
        """The job's row if a live worker's report lists it running."""
        return next((row for row in self.jobs if row.job.job_id == job_id), None)

    def to_dict(self) -> dict[str, Any]:
        ages = self.report_age_s()
        return {"at_ms": self.at_ms, "job_type": self.job_type,
                "live_workers": len(self.workers), "running": self.running_count,
                "unlisted": self.unlisted,
                "report_age_s": None if ages is None else {"freshest": round(ages[0], 3),
                                                           "stalest": round(ages[1], 3)},
                "jobs": [row.to_dict(self.at_ms) for row in self.jobs],
                "workers": [p.to_dict(self.at_ms) for p in self.processes]}


def running_view(reports: Iterable[WorkerReport], *, now_ms: int, job_type: str | None = None,
                 report_interval_s: float = DEFAULT_REPORT_INTERVAL_S) -> RunningView:
    """The live workers (of `job_type`, or of every type) among `reports`, by worker ID."""
    chosen = (r for r in reports if job_type is None or r.job_type == job_type)
    return RunningView(now_ms, tuple(alive_workers(chosen, now_ms=now_ms,
                                                   report_interval_s=report_interval_s)),
                       job_type)


__all__ = ["RunningRow", "RunningView", "WorkerProcess", "running_view"]
