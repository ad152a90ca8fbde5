"""`/ui/running`, `/ui/types/{type}/running` and `/ui/workers`: the jobs in live workers'
handlers now (longest running first), and the live worker processes, from the workers'
latest reports in `P._stats` (`stream_jobs.tools.running`), read at each request. The
running pages list jobs, so they need a signed-in session; the workers page is an
aggregate, open like `/`."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from stream_jobs.gateway.pages.common import GatewayDep, page, session_of, to_login
from stream_jobs.job_types import get_job_type
from stream_jobs.tools.worker_reports import read_running

router = APIRouter(include_in_schema=False)


@router.get("/ui/running", response_class=HTMLResponse)
async def running_page(request: Request, gateway: GatewayDep) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    view = await read_running(gateway.settings, gateway.types)
    return page("running.html", view=view, job_type=None, quote=quote, session=session,
                current="/ui/running")


@router.get("/ui/types/{job_type}/running", response_class=HTMLResponse)
async def type_running_page(request: Request, job_type: str,
                            gateway: GatewayDep) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    get_job_type(gateway.types, job_type)
    view = await read_running(gateway.settings, gateway.types, job_type=job_type)
    return page("running.html", view=view, job_type=job_type, quote=quote, session=session,
                current="/ui/running")


@router.get("/ui/workers", response_class=HTMLResponse)
async def workers_page(request: Request, gateway: GatewayDep) -> Response:
    view = await read_running(gateway.settings, gateway.types)
    return page("workers.html", view=view, quote=quote, session=session_of(request, gateway),
                current="/ui/workers")


__all__ = ["router"]
