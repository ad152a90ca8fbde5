"""`/ui/outbox`: how much waits in the outbox (rows, the oldest row's age, rows whose
write failed), by topic, and the failing rows with their errors: what `stream-jobs outbox
status` shows, read from Postgres when the page is opened. Open, like `/`."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from stream_jobs.errors import ConfigError, StreamJobsError
from stream_jobs.gateway.pages.common import GatewayDep, page
from stream_jobs.outbox.depth import depth_by_topic, failing_rows, read_depth
from stream_jobs.redaction import redact_text

router = APIRouter(include_in_schema=False)
READ_WAIT_S = 10.0


@router.get("/ui/outbox", response_class=HTMLResponse)
async def outbox(gateway: GatewayDep) -> HTMLResponse:
    settings = gateway.settings
    try:
        depth, topics, failing = await asyncio.wait_for(asyncio.gather(
            read_depth(settings), depth_by_topic(settings), failing_rows(settings)),
            READ_WAIT_S)
    except ConfigError as exc:  # no outbox table in this schema
        return page("outbox.html", current="/ui/outbox", missing=str(exc), problem=None)
    except (StreamJobsError, TimeoutError) as exc:
        return page("outbox.html", current="/ui/outbox", missing=None,
                    problem=redact_text(str(exc), settings)
                    or f"Postgres did not answer within {READ_WAIT_S:g} s")
    return page("outbox.html", current="/ui/outbox", missing=None, problem=None, depth=depth,
                topics=topics, failing=failing)


__all__ = ["router"]
