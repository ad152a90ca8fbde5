"""`GET /types/{type}/history?window=1h|24h|7d`: one type's history (docs/history.md), as
`stream-jobs stats TYPE --history W --json` prints it. Open, like the other /types routes.

404 for an unknown type, 422 for another window (or a schema without the history
table: run `stream-jobs db migrate`), 503 when Postgres does not answer. A span with no
finished job answers 200 with no rows and a `note` saying how to start the history.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from stream_jobs.gateway.api import Problem, StrictJsonRoute, TypeName
from stream_jobs.gateway.state import Gateway, gateway_of
from stream_jobs.history.reader import read_view
from stream_jobs.job_types import get_job_type

router = APIRouter(route_class=StrictJsonRoute)
GatewayDep = Annotated[Gateway, Depends(gateway_of)]
Window = Literal["1h", "24h", "7d"]


class DwellQuantiles(BaseModel):
    p50: float | None
    p95: float | None


class DurationQuantiles(DwellQuantiles):
    p99: float | None


class HistoryRowOut(BaseModel):
    """One window (the `totals`: the span's windows added up)."""

    start: str = Field(description="The window's start, ISO 8601 in UTC with milliseconds.")
    start_ms: int
    size_s: int
    open: bool = Field(description="True for the window that has not ended yet.")
    outcomes: dict[str, int] = Field(description="Jobs finished, by outcome.")
    finished: int
    failed: int = Field(description="retried + dead_lettered.")
    failure_ratio: float | None = Field(description="failed / finished; null with none.")
    per_min: float = Field(description="Jobs finished per minute over the time the window "
                           "covers (for an open one, so far).")
    duration_s: DurationQuantiles = Field(description="Handler duration percentiles: the upper "
                                  "bound of the bucket each falls in; null without runs.")
    dwell_s: DwellQuantiles = Field(description="Waits from due to start, percentiles as above.")


class HistoryOut(BaseModel):
    job_type: str
    window: str
    size_s: int = Field(description="Each window's length: a minute for 1h, an hour else.")
    span_s: int
    note: str | None = Field(description="Set when no job finished in the span: how to "
                             "start the history process.")
    totals: HistoryRowOut
    rows: list[HistoryRowOut] = Field(description="Every window with jobs, oldest first.")


@router.get("/types/{type}/history", response_model=HistoryOut, tags=["types"], responses={
    404: {"model": Problem, "description": "Unknown job type."},
    503: {"model": Problem, "description": "Postgres did not answer; try again after "
          "Retry-After seconds."}})
async def type_history(job_type: TypeName, gateway: GatewayDep,
                       window: Annotated[Window, Query(description="The span: the last "
                                                       "hour in minute windows, the last "
                                                       "day or week in hour windows.")]
                       = "1h") -> HistoryOut:
    """Jobs by outcome, failure ratio, jobs/min and duration and dwell percentiles per
    window over the span, and their totals, from the history process's windows."""
    get_job_type(gateway.types, job_type)
    view = await read_view(gateway.recent.store, job_type, window)
    return HistoryOut.model_validate(view.to_dict())


__all__ = ["router"]
