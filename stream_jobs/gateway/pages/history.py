"""`/ui/history?type=T&span=1h|24h|7d`: charts of a type's history (throughput, failure
ratio, p95 dwell and p95 handler duration) over the last hour (minute windows), day or
week (hour windows), with the span's totals; without `type`, a card per declared type.
Read from the history process's windows in Postgres (as `stats TYPE --history` and
`GET /types/{type}/history` read them) when the page is opened. Open, like `/`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from stream_jobs.errors import StreamJobsError
from stream_jobs.gateway.charts import line_chart
from stream_jobs.gateway.pages.common import GatewayDep, page
from stream_jobs.history.reader import read_view
from stream_jobs.history.view import NO_HISTORY, HistoryRow, HistoryView
from stream_jobs.history.windows import SPANS
from stream_jobs.redaction import redact_text

router = APIRouter(include_in_schema=False)
READ_WAIT_S = 10.0


def charts(view: HistoryView) -> dict[str, Any]:
    """The view's four charts and its totals. Throughput per minute over minute windows,
    per hour over hour windows; the last hour leaves out the minute still open (its
    first seconds would draw a rate of a few jobs), hour windows keep theirs, its rate
    over the time it has been open."""
    rows = [r for r in view.rows if not (r.open and view.window == "1h")]
    per_hour = view.size_s >= 3600
    end_ms = view.since_ms + view.span_s * 1000

    def points(value: Callable[[HistoryRow], float | None]) -> list[tuple[int, float | None]]:
        return [(r.start_ms + round(r.covered_s * 1000), value(r)) for r in rows]

    def draw(value: Callable[[HistoryRow], float | None], title: str, unit: str,
             percent: bool = False) -> Any:
        return line_chart(points(value), title=title, unit=unit, end_ms=end_ms,
                          span_s=view.span_s, percent=percent)

    return {"totals": view.totals(), "per_hour": per_hour, "charts": [
        draw((lambda r: r.per_min * 60) if per_hour else (lambda r: r.per_min),
             "jobs/h" if per_hour else "jobs/min", "/h" if per_hour else "/min"),
        draw(lambda r: r.failure_ratio, "failure ratio", "", percent=True),
        draw(lambda r: r.tally.dwell_s(0.95), "p95 dwell", "s"),
        draw(lambda r: r.tally.duration_s(0.95), "p95 handler duration", "s")]}


@router.get("/ui/history", response_class=HTMLResponse)
async def history(gateway: GatewayDep, type: str | None = None,
                  span: str = "1h") -> HTMLResponse:
    if span not in SPANS:
        return page("problem.html", status_code=400, title="No such span",
                    problem=f"The span {span!r} is not one of {', '.join(SPANS)}: open "
                    "/ui/history?span=1h (the last hour), 24h or 7d.")
    if type is not None and type not in gateway.types:
        known = ", ".join(sorted(gateway.types)) or "none"
        return page("problem.html", status_code=404, title="No such job type",
                    problem=f"No job type {type!r} is declared in "
                    f"{gateway.settings.topics_dir} (declared: {known}).")
    chosen = [type] if type is not None else sorted(gateway.types)
    store = gateway.recent.store
    try:
        views = await asyncio.wait_for(
            asyncio.gather(*(read_view(store, t, span) for t in chosen)), READ_WAIT_S)
    except (StreamJobsError, TimeoutError) as exc:
        problem = (redact_text(str(exc), gateway.settings)
                   or f"Postgres did not answer within {READ_WAIT_S:g} s")
        return page("history.html", current="/ui/history", job_type=type, span=span,
                    spans=list(SPANS), cards=[], problem=problem, no_history=NO_HISTORY)
    cards = [{"view": v, **({} if v.empty else charts(v))} for v in views]
    return page("history.html", current="/ui/history", job_type=type, span=span,
                spans=list(SPANS), cards=cards, problem=None, no_history=NO_HISTORY)


__all__ = ["charts", "router"]
