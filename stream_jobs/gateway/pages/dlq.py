"""`/ui/dlq/{type}`: the DLQ browsed (reason histogram, recent letters, a letter's
details) and requeued, always through a confirmation page that shows what a dry run
found. Needs a signed-in session."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from stream_jobs.dlq.listing import list_letters, show_letter
from stream_jobs.dlq.requeue import requeue
from stream_jobs.errors import ConfigError, LetterNotFound
from stream_jobs.gateway.api import RequeueIn, run_requeue
from stream_jobs.gateway.charts import bar_chart
from stream_jobs.gateway.pages.common import (
    GatewayDep,
    checked_form,
    page,
    session_of,
    stale_form,
    to_login,
)
from stream_jobs.job_types import get_job_type

router = APIRouter(include_in_schema=False)


@router.get("/ui/dlq/{job_type}", response_class=HTMLResponse)
async def dlqpage(request: Request, job_type: str, gateway: GatewayDep,
                   reason: str | None = None, done: str | None = None) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    get_job_type(gateway.types, job_type)
    listing = await list_letters(gateway.settings, job_type, reason=reason or None, limit=50)
    histogram = bar_chart(list(listing.job_reasons.items()), title="jobs by reason")
    return page("dlq.html", listing=listing, histogram=histogram, reason=reason or "",
                 done=done, rows=list(reversed(listing.rows)), quote=quote,
                 session=session)


@router.get("/ui/dlq/{job_type}/letters/{job_id}", response_class=HTMLResponse)
async def letterpage(request: Request, job_type: str, job_id: str,
                      gateway: GatewayDep) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    get_job_type(gateway.types, job_type)
    letter = await show_letter(gateway.settings, job_type, job_id)
    return page("letter.html", letter=letter, quote=quote, session=session)


@router.get("/ui/dlq/{job_type}/requeue", response_class=HTMLResponse)
async def confirm_requeue(request: Request, job_type: str, gateway: GatewayDep,
                          id: str | None = None, reason: str | None = None) -> Response:
    """What a requeue would do (a dry run), with the button that does it."""
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    get_job_type(gateway.types, job_type)
    body = _selection(id, reason)
    result = await requeue(gateway.settings, job_type, select=body.selection(), dry_run=True)
    return page("confirm.html", job_type=job_type, job_id=id or "", reason=reason or "",
                 plan=result.plan, session=session)


@router.post("/ui/dlq/{job_type}/requeue")
async def do_requeue(request: Request, job_type: str, gateway: GatewayDep) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    get_job_type(gateway.types, job_type)
    if (form := await checked_form(request, session)) is None:
        return stale_form()
    body = _selection(form.get("id") or None, form.get("reason") or None)
    try:
        result = await run_requeue(gateway, job_type, body)
    except LetterNotFound as exc:
        done = str(exc)
    else:
        left = ", ".join(f"{n} left ({why})" for why, n in result.left.items())
        done = f"Requeued {result.requeued} of {result.selected} selected" + \
            (f"; {left}" if left else "") + "."
    return RedirectResponse(f"/ui/dlq/{quote(job_type)}?{urlencode({'done': done})}",
                            status_code=303)



def _selection(job_id: str | None, reason: str | None) -> RequeueIn:
    if job_id:
        return RequeueIn(ids=[job_id])
    if reason:
        return RequeueIn(reason=reason)
    raise ConfigError("Choose a letter (id) or a reason to requeue.")


__all__ = ["router"]
