"""`/ui/jobs/{id}`: what happened to one job (its state, attempts, result, trace, tenant
and payload, masked as its type's `redact` says), with buttons that cancel it while it
has not finished, retry it now while it waits in a delay tier, and requeue it when it
is dead-lettered, each through a confirmation page. Needs a signed-in session."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
from stream_jobs.lookup.attempts import NOT_RECORDED, steps_of
from stream_jobs.redaction import shown_payload
from stream_jobs.tools.cancel import cancel_job
from stream_jobs.tools.job_status import locate
from stream_jobs.tools.retry_now import retry_now
from stream_jobs.tracing.rules import tenant_of

router = APIRouter(include_in_schema=False)


_CANCELLABLE = ("pending", "running", "retrying", "scheduled")
_RETRYABLE = ("retrying", "scheduled")  # waiting in a delay tier


async def _located(gateway: Gateway, job_id: str, job_type: str | None) -> JobLocation:
    if job_type:
        get_job_type(gateway.types, job_type)
    # A done job's records too: the page lists them and shows its trace ID.
    return await locate(gateway.settings, gateway.types, job_id, job_type=job_type or None,
                        records_of_done=True)


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
async def jobpage(request: Request, job_id: str, gateway: GatewayDep,
                   type: str | None = None, done: str | None = None) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    found = await _located(gateway, job_id, type)
    policy = gateway.types.get(found.job_type) if found.job_type else None
    redact = policy.redact if policy is not None else ()
    return page("job.html", found=found, done=done, quote=quote, steps=steps_of(found),
                cancellable=found.status in _CANCELLABLE, session=session,
                retryable=found.status in _RETRYABLE, tenant=tenant_of(found),
                not_recorded=NOT_RECORDED, redact=redact,
                payload=shown_payload(found.payload, redact))


@router.get("/ui/jobs/{job_id}/cancel", response_class=HTMLResponse)
async def confirm_cancel(request: Request, job_id: str, gateway: GatewayDep,
                         type: str | None = None) -> Response:
    """What the job is doing now, with the button that cancels it."""
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    found = await _located(gateway, job_id, type)
    return page("cancel.html", found=found, quote=quote, session=session)


async def _act(request: Request, job_id: str, gateway: GatewayDep,
               action: Callable[[str | None, dict[str, str]], Awaitable[str]]) -> Response:
    """A button's post on a job: signed in, the session's CSRF token, the type checked;
    `action(type, form)` says what it did (or the error), shown on the job's page."""
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    if (form := await checked_form(request, session)) is None:
        return stale_form()
    job_type = form.get("type") or None
    if job_type:
        get_job_type(gateway.types, job_type)
    try:
        done = await action(job_type, form)
    except StreamJobsError as exc:
        done = str(exc)
    return RedirectResponse(f"/ui/jobs/{quote(job_id, safe='')}?{urlencode({'done': done})}",
                            status_code=303)


@router.post("/ui/jobs/{job_id}/cancel")
async def do_cancel(request: Request, job_id: str, gateway: GatewayDep) -> Response:
    async def cancel(job_type: str | None, form: dict[str, str]) -> str:
        return (await cancel_job(gateway.settings, gateway.types, job_id, job_type=job_type,
                                 reason=form.get("reason") or None)).summary()

    return await _act(request, job_id, gateway, cancel)


@router.get("/ui/jobs/{job_id}/retry-now", response_class=HTMLResponse)
async def confirm_retry_now(request: Request, job_id: str, gateway: GatewayDep,
                            type: str | None = None) -> Response:
    """Where the job waits and until when, with the button that runs it now."""
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    found = await _located(gateway, job_id, type)
    return page("retry_now.html", found=found, quote=quote, session=session,
                retryable=found.status in _RETRYABLE)


@router.post("/ui/jobs/{job_id}/retry-now")
async def do_retry_now(request: Request, job_id: str, gateway: GatewayDep) -> Response:
    async def run_now(job_type: str | None, _: dict[str, str]) -> str:
        return (await retry_now(gateway.settings, gateway.types, job_id,
                                job_type=job_type)).summary()

    return await _act(request, job_id, gateway, run_now)


__all__ = ["router"]
