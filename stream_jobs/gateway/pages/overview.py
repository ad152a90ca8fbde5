"""`/`: every type's lanes, tiers, DLQ depth, oldest job and live workers; charts of the
last hour from the history process's windows (jobs/min, failure ratio, p95 duration and
p95 dwell per minute window, so a restarted gateway draws the same hour) and of the lag
from the gateway's own samples (since it started); the schedules and the open batches
and chains, read from Postgres. It refreshes itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from stream_jobs import clock
from stream_jobs.errors import StreamJobsError
from stream_jobs.gateway.charts import line_chart
from stream_jobs.gateway.pages.common import GatewayDep, page
from stream_jobs.gateway.recent import RecentHistory
from stream_jobs.gateway.state import Gateway
from stream_jobs.history.view import NO_HISTORY, HistoryRow
from stream_jobs.redaction import redact_text
from stream_jobs.schedules.listing import ScheduleView, read_schedules
from stream_jobs.workflows.progress import Progress, open_workflows

router = APIRouter(include_in_schema=False)
SCHEDULES_WAIT_S = 3.0
OPEN_BATCHES_SHOWN = 20


@router.get("/", response_class=HTMLResponse)
async def overview(gateway: GatewayDep) -> HTMLResponse:
    sampler = gateway.sampler
    snapshot = sampler.latest
    now_ms = clock.now_ms()
    cards = []
    for stats in snapshot.types if snapshot is not None else ():
        series = sampler.series(stats.job_type)
        cards.append({
            "stats": stats,
            "done": stats.rates.counts.done,
            "failed": stats.rates.counts.retried + stats.rates.counts.dead_lettered,
            "in_flight": sum(w.in_flight for w in stats.workers),
            "backlog": line_chart([(t, float(p.lag)) for t, p in series],
                                  title="lag since the gateway started", unit="jobs",
                                  end_ms=now_ms),
            **_history_charts(gateway.recent, stats.job_type, now_ms),
        })
    schedules, schedules_problem = await _schedules(gateway)
    batches_open, batches = await _open_batches(gateway)
    return page("overview.html", current="/", cards=cards, snapshot=snapshot,
                 problem=sampler.problem, declared=sorted(gateway.types),
                 refresh_s=max(2, round(sampler.interval_s)),
                 window_s=sampler.window_s, schedules=schedules,
                 schedules_problem=schedules_problem, now_ms=now_ms,
                 batches_open=batches_open, batches=batches)


def _history_charts(recent: RecentHistory, job_type: str, now_ms: int) -> dict[str, Any]:
    """The last hour from the history: charts of the closed minute windows (a window
    still open would draw a rate of its first seconds), the hour's figures, and a note
    when there is nothing to draw."""
    view = recent.views.get(job_type)
    if view is None or view.empty:
        counted = recent.totals is not None and job_type in recent.totals
        note = (f"History could not be read: {recent.problem}" if recent.problem else
                "No job finished in the last hour." if counted else
                f"No history recorded: the history process is not running (or no job has "
                f"finished yet); {NO_HISTORY}.")
        return {"history": None, "history_note": note}
    closed = [r for r in view.rows if not r.open]

    def points(value: Callable[[HistoryRow], float | None]) -> list[tuple[int, float | None]]:
        return [(r.start_ms + r.size_s * 1000, value(r)) for r in closed]

    return {"history": view.totals(), "history_note": None, "charts": [
        line_chart(points(lambda r: r.per_min), title="jobs/min", unit="/min", end_ms=now_ms),
        line_chart(points(lambda r: r.failure_ratio), title="failure ratio", unit="",
                   end_ms=now_ms, percent=True),
        line_chart(points(lambda r: r.tally.duration_s(0.95)), title="p95 duration",
                   unit="s", end_ms=now_ms),
        line_chart(points(lambda r: r.tally.dwell_s(0.95)), title="p95 dwell", unit="s",
                   end_ms=now_ms)]}


async def _open_batches(gateway: Gateway) -> tuple[int, list[Progress]]:
    """The open batches and chains, oldest first; none shown when they cannot be read (a
    deployment may have no workflow tables, and a Postgres that does not answer costs the
    page at most SCHEDULES_WAIT_S)."""
    try:
        return await asyncio.wait_for(open_workflows(gateway.settings, OPEN_BATCHES_SHOWN),
                                      SCHEDULES_WAIT_S)
    except (StreamJobsError, TimeoutError):
        return 0, []


async def _schedules(gateway: Gateway) -> tuple[list[ScheduleView], str | None]:
    """The schedules, or why they could not be read (said only when some are declared:
    a deployment without schedules may have no schedules table at all). A Postgres that
    does not answer costs the page at most SCHEDULES_WAIT_S."""
    try:
        return await asyncio.wait_for(read_schedules(gateway.settings, gateway.types),
                                      SCHEDULES_WAIT_S), None
    except (StreamJobsError, TimeoutError) as exc:
        declared = any(p.schedules for p in gateway.types.values())
        problem = (redact_text(str(exc), gateway.settings)
                   or f"Postgres did not answer within {SCHEDULES_WAIT_S:g} s")
        return [], problem if declared else None



__all__ = ["router"]
