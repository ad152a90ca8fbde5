"""`POST /jobs/{job_id}/retry-now[?type=T]`: a job waiting in a delay tier runs now, once
(docs/control.md), as `stream-jobs retry-now` does. Needs the bearer token.

404 for an unknown job or type, 409 for a job not waiting in a delay tier (done,
running, pending, dead-lettered, cancelled) or an attempt retried now before, 503 when
Kafka or Postgres does not answer (nothing was changed then).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, Field

from stream_jobs.gateway.api import Problem, StrictJsonRoute
from stream_jobs.gateway.auth import Authorized
from stream_jobs.gateway.state import Gateway, gateway_of
from stream_jobs.job_types import get_job_type
from stream_jobs.tools.retry_now import retry_now

router = APIRouter(route_class=StrictJsonRoute)
GatewayDep = Annotated[Gateway, Depends(gateway_of)]


class RetryNowOut(BaseModel):
    job_id: str
    job_type: str
    attempt: int = Field(description="The attempt that runs now.")
    tier: str = Field(description="The delay tier it waited in.")
    due_ms: int | None = Field(description="When it would have run (Unix ms).")
    lane_topic: str
    partition: int
    offset: int = Field(description="Where its copy was written in the lane.")
    summary: str


def _problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    described = {
        401: "No bearer token, or not the gateway's.",
        404: "Unknown job type or job.",
        409: "The job is not waiting in a delay tier, or this attempt was retried now before.",
        503: "Kafka or Postgres did not answer; nothing was changed.",
    }
    return {code: {"model": Problem, "description": described[code]} for code in codes}


@router.post("/jobs/{job_id}/retry-now", response_model=RetryNowOut, tags=["jobs"],
             dependencies=[Authorized], responses=_problems(401, 404, 409, 503))
async def retry_now_route(gateway: GatewayDep,
                          job_id: Annotated[str, Path(min_length=1, max_length=64)],
                          job_type: Annotated[str | None,
                                              Query(alias="type", max_length=249)] = None
                          ) -> RetryNowOut:
    """Run a job that waits in a delay tier (a retry, or a delayed enqueue) now instead
    of at its due time, once: a copy of its waiting attempt goes to its lane, and the
    original is not released. `type` narrows the search to one type's topics."""
    if job_type is not None:
        get_job_type(gateway.types, job_type)
    done = await retry_now(gateway.settings, gateway.types, job_id, job_type=job_type)
    return RetryNowOut(**done.to_dict())  # type: ignore[arg-type]


__all__ = ["router"]
