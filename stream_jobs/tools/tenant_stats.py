"""`stream-jobs stats T --tenants`: a type's tenants, from a scan of its lanes and its
overflow lane and from its workers' reports (`stream_jobs.fairness.census`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from stream_jobs.fairness.census import DEFAULT_MAX_RECORDS, TenantCensus, tenant_census
from stream_jobs.fairness.tally import TOP_TENANTS, TenantSection
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.runtime.reports import WorkerReport
from stream_jobs.settings import Settings
from stream_jobs.tools.type_stats import (
    ALIVE_INTERVALS,
    DEFAULT_REPORT_INTERVAL_S,
    DEFAULT_WINDOW_S,
    alive_workers,
)
from stream_jobs.tools.worker_reports import recent_reports

log = logging.getLogger("stream_jobs.stats")


def sections_of(reports: Sequence[WorkerReport], job_type: str, *, now_ms: int,
                window_s: float) -> tuple[list[TenantSection], int]:
    """(the tenant sections to fold: what each live worker holds now, and the dwells of
    every report of the last `window_s`; how many workers are alive)."""
    own = [r for r in reports if r.job_type == job_type]
    alive = alive_workers(own, now_ms=now_ms)
    since_ms = now_ms - int(window_s * 1000)
    held = [_section(r).only(in_flight=True) for r in alive]
    dwelt = [_section(r).only(in_flight=False) for r in own if r.at_ms >= since_ms]
    return held + dwelt, len(alive)


def _section(report: WorkerReport) -> TenantSection:
    try:
        return TenantSection.from_obj(report.tenants)
    except (ValueError, TypeError) as exc:
        log.warning("tenants of the report of %s left out: %s", report.worker_id, exc)
        return TenantSection()


async def collect_tenants(settings: Settings, types: Mapping[str, JobTypePolicy],
                          job_type: str, *, window_s: float = DEFAULT_WINDOW_S,
                          top: int = TOP_TENANTS, max_records: int = DEFAULT_MAX_RECORDS
                          ) -> TenantCensus:
    """`job_type`'s tenants (UnknownJobType if undeclared): the top `top` by unfinished
    jobs and the rest, dwell over the last `window_s` seconds."""
    policy = get_job_type(types, job_type)
    at_ms, reports = await recent_reports(
        settings, lookback_s=window_s + (ALIVE_INTERVALS + 1) * DEFAULT_REPORT_INTERVAL_S)
    sections, workers = sections_of(reports, job_type, now_ms=at_ms,
                                    window_s=window_s)
    return await tenant_census(settings, policy, sections, workers=workers, top=top,
                               max_records=max_records)


__all__ = ["collect_tenants", "sections_of"]
