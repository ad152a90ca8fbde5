"""`/ui/batches`: the open batches and chains (oldest first) and the ones finished last,
each with its members succeeded, failed and pending as a bar, its state and which of its
callbacks have been written; `/ui/batches/{id}`: one of them. Read from the workflows'
rows, whose counters move in each member's finish transaction, so exact as of the page.
Open, like `/`."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from stream_jobs.errors import StreamJobsError, UnknownWorkflow
from stream_jobs.gateway.pages.common import GatewayDep, page
from stream_jobs.redaction import redact_text
from stream_jobs.workflows.progress import finished_workflows, open_workflows, read_progress

router = APIRouter(include_in_schema=False)
READ_WAIT_S = 10.0
SHOWN = 20


@router.get("/ui/batches", response_class=HTMLResponse)
async def batches(gateway: GatewayDep) -> HTMLResponse:
    settings = gateway.settings
    try:
        (count, running), finished = await asyncio.wait_for(asyncio.gather(
            open_workflows(settings, SHOWN), finished_workflows(settings, SHOWN)), READ_WAIT_S)
    except (StreamJobsError, TimeoutError) as exc:
        problem = (redact_text(str(exc), settings)
                   or f"Postgres did not answer within {READ_WAIT_S:g} s")
        return page("batches.html", current="/ui/batches", problem=problem, running=[],
                    finished=[], open_count=0, shown=SHOWN)
    return page("batches.html", current="/ui/batches", problem=None, running=running,
                finished=finished, open_count=count, shown=SHOWN)


@router.get("/ui/batches/{workflow_id}", response_class=HTMLResponse)
async def batch(workflow_id: str, gateway: GatewayDep) -> HTMLResponse:
    try:
        found = await asyncio.wait_for(read_progress(gateway.settings, workflow_id),
                                       READ_WAIT_S)
    except UnknownWorkflow as exc:
        return page("problem.html", status_code=404, title="No such batch or chain",
                    problem=str(exc))
    except (StreamJobsError, TimeoutError) as exc:
        return page("problem.html", status_code=503, title="Batches could not be read",
                    problem=redact_text(str(exc), gateway.settings)
                    or f"Postgres did not answer within {READ_WAIT_S:g} s")
    return page("batch.html", current="/ui/batches", b=found)


__all__ = ["router"]
