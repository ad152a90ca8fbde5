"""Reading `P._stats`: the workers' reports of the last seconds, as `stream-jobs stats`,
`running`, `workers` and `job` read them (the rules they apply: `type_stats`, `running`).

A reading is bounded by time, not by the number of workers that ever ran: from the
offset of `lookback_s` ago to the end the reading starts at (one partition).
"""

from __future__ import annotations

from collections.abc import Mapping

from stream_jobs import clock
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka import scan
from stream_jobs.kafka.consumer import Consumer, open_reader
from stream_jobs.naming import stats_topic
from stream_jobs.runtime.reports import ShadowReport, WorkerReport
from stream_jobs.settings import Settings
from stream_jobs.tools.running import RunningView, running_view
from stream_jobs.tools.type_stats import ALIVE_INTERVALS, DEFAULT_REPORT_INTERVAL_S

# Long enough to hold a live worker's latest report (ALIVE_INTERVALS of the usual
# interval), and one interval more.
LIVE_LOOKBACK_S = (ALIVE_INTERVALS + 1) * DEFAULT_REPORT_INTERVAL_S


async def scan_reports(consumer: Consumer, topic: str, ranges: list[scan.PartitionRange]
                       ) -> tuple[list[WorkerReport], list[ShadowReport]]:
    """The workers' and the shadows' reports in `ranges` of `topic`, in order."""
    found: list[WorkerReport] = []
    shadows: list[ShadowReport] = []
    async for record in scan.scan(consumer, topic, ranges):
        report = WorkerReport.from_json(record.value)
        if report is not None:
            found.append(report)
            continue
        shadow = ShadowReport.from_json(record.value)
        if shadow is not None:
            shadows.append(shadow)
    return found, shadows


async def recent_reports(settings: Settings, *, lookback_s: float = LIVE_LOOKBACK_S
                         ) -> tuple[int, list[WorkerReport]]:
    """(when the reading started, in ms; the workers' reports of the `lookback_s` before
    it). No stats topic yet (no worker ever reported) reads as no reports."""
    topic = stats_topic(settings.topic_prefix)
    at_ms = clock.now_ms()
    async with open_reader(settings, client_id="stream-jobs-running") as consumer:
        if not await consumer.cluster_partitions(topic):
            return at_ms, []
        ranges = await scan.ranges(consumer, topic,
                                   from_time_ms=at_ms - int(lookback_s * 1000))
        reports, _ = await scan_reports(consumer, topic, ranges)
    return at_ms, reports


async def read_running(settings: Settings, types: Mapping[str, JobTypePolicy], *,
                       job_type: str | None = None) -> RunningView:
    """The live workers and what they run, of `job_type` (UnknownJobType if undeclared)
    or of every type."""
    if job_type is not None:
        get_job_type(types, job_type)
    at_ms, reports = await recent_reports(settings)
    return running_view(reports, now_ms=at_ms, job_type=job_type)


__all__ = ["LIVE_LOOKBACK_S", "read_running", "recent_reports", "scan_reports"]
