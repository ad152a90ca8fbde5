"""`/ui/jobs/{id}`: what happened to one job, with a button that cancels it (through a
confirmation page) while it has not finished. Needs a signed-in session."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from stream_jobs.errors import StreamJobsError
from stream_jobs.gateway.pages.common import (
    GatewayDep,
    checked_form,
    page,
    session_of,
    stale_form,
    to_login,
)
from stream_jobs.gateway.state import Gateway
from stream_jobs.job_types import get_job_type
from stream_jobs.lookup import JobLocation
from stream_jobs.tools.cancel import cancel_job
from stream_jobs.tools.job_status import locate

router = APIRouter(include_in_schema=False)


_CANCELLABLE = ("pending", "running", "retrying", "scheduled")


async def _located(gateway: Gateway, job_id: str, job_type: str | None) -> JobLocation:
    if job_type:
        get_job_type(gateway.types, job_type)
    # A done job's records too: the page lists them and shows its trace ID.
    return await locate(gateway.settings, gateway.types, job_id, job_type=job_type or None,
                        records_of_done=True)


@router.get("/ui/jobs")
async def find_job(id: str | None = None) -> Response:
    """The overview's search box: to the job's page."""
    target = f"/ui/jobs/{quote(id.strip(), safe='')}" if id and id.strip() else "/"
    return RedirectResponse(target, status_code=303)


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
async def jobpage(request: Request, job_id: str, gateway: GatewayDep,
                   type: str | None = None, done: str | None = None) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    found = await _located(gateway, job_id, type)
    return page("job.html", found=found, done=done, quote=quote,
                 cancellable=found.status in _CANCELLABLE, session=session)


@router.get("/ui/jobs/{job_id}/cancel", response_class=HTMLResponse)
async def confirm_cancel(request: Request, job_id: str, gateway: GatewayDep,
                         type: str | None = None) -> Response:
    """What the job is doing now, with the button that cancels it."""
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    found = await _located(gateway, job_id, type)
    return page("cancel.html", found=found, quote=quote, session=session)


@router.post("/ui/jobs/{job_id}/cancel")
async def do_cancel(request: Request, job_id: str, gateway: GatewayDep) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    if (form := await checked_form(request, session)) is None:
        return stale_form()
    job_type = form.get("type") or None
    if job_type:
        get_job_type(gateway.types, job_type)
    try:
        answer = await cancel_job(gateway.settings, gateway.types, job_id, job_type=job_type,
                                  reason=form.get("reason") or None)
    except StreamJobsError as exc:
        done = str(exc)
    else:
        done = answer.summary()
    return RedirectResponse(f"/ui/jobs/{quote(job_id, safe='')}?{urlencode({'done': done})}",
                            status_code=303)



__all__ = ["router"]
