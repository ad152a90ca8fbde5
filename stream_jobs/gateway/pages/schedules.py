"""`/ui/schedules`: every schedule (declared in topics/ or known from its row), its next
and last firing, whether it is paused, and the scheduler leading its type with the time
its lease would end; Pause, Resume and Trigger (through a confirmation page) from a
signed-in session, by the same functions as `stream-jobs schedules` (tools.schedules).
The page itself is open, like `/`."""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from stream_jobs import clock
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
from stream_jobs.redaction import redact_text
from stream_jobs.schedules.listing import ScheduleView, read_schedules
from stream_jobs.tools.schedules import find, set_schedule_paused, trigger_schedule

router = APIRouter(include_in_schema=False)
# A Postgres that does not answer costs the page at most this (a loaded one may take
# seconds to open a connection).
READ_WAIT_S = 10.0


async def read_views(gateway: Gateway) -> tuple[list[ScheduleView], str | None]:
    """The schedules, or why they could not be read."""
    try:
        return await asyncio.wait_for(read_schedules(gateway.settings, gateway.types),
                                      READ_WAIT_S), None
    except (StreamJobsError, TimeoutError) as exc:
        return [], (redact_text(str(exc), gateway.settings)
                    or f"Postgres did not answer within {READ_WAIT_S:g} s")


@router.get("/ui/schedules", response_class=HTMLResponse)
async def schedules(request: Request, gateway: GatewayDep,
                    done: str | None = None) -> HTMLResponse:
    views, problem = await read_views(gateway)
    return page("schedules.html", current="/ui/schedules", schedules=views, problem=problem,
                done=done, now_ms=clock.now_ms(), lease_s=gateway.settings.scheduler_lease_s,
                session=session_of(request, gateway))


def _back(done: str) -> RedirectResponse:
    return RedirectResponse(f"/ui/schedules?{urlencode({'done': done})}", status_code=303)


async def _toggle(request: Request, gateway: Gateway, paused: bool) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    if (form := await checked_form(request, session)) is None:
        return stale_form()
    try:
        done = await set_schedule_paused(gateway.settings, gateway.types, form.get("name", ""),
                                         form.get("type") or None, paused)
    except StreamJobsError as exc:
        done = redact_text(str(exc), gateway.settings)
    return _back(done)


@router.post("/ui/schedules/pause")
async def pause(request: Request, gateway: GatewayDep) -> Response:
    return await _toggle(request, gateway, True)


@router.post("/ui/schedules/resume")
async def resume(request: Request, gateway: GatewayDep) -> Response:
    return await _toggle(request, gateway, False)


@router.get("/ui/schedules/trigger", response_class=HTMLResponse)
async def confirm_trigger(request: Request, gateway: GatewayDep, name: str = "",
                          type: str | None = None) -> Response:
    """The schedule, with the button that enqueues one run of it now."""
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    try:
        view = await find(gateway.settings, gateway.types, name, type or None)
    except StreamJobsError as exc:
        return page("problem.html", status_code=404, title="No such schedule",
                    problem=redact_text(str(exc), gateway.settings))
    return page("trigger.html", current="/ui/schedules", s=view, session=session)


@router.post("/ui/schedules/trigger")
async def do_trigger(request: Request, gateway: GatewayDep) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    if (form := await checked_form(request, session)) is None:
        return stale_form()
    try:
        triggered = await trigger_schedule(gateway.settings, gateway.types,
                                           form.get("name", ""), form.get("type") or None)
    except StreamJobsError as exc:
        return _back(redact_text(str(exc), gateway.settings))
    return _back(triggered.summary())


__all__ = ["read_views", "router"]
