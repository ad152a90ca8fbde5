"""`/login` and `/logout`: a session from the gateway's token (`sessions.py`), with
wrong tokens throttled per client."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from stream_jobs.gateway.pages.common import (
    GatewayDep,
    checked_form,
    page,
    read_form,
    safe_next,
    session_of,
    stale_form,
)
from stream_jobs.gateway.sessions import FAILURE_WINDOW_S
from stream_jobs.gateway.state import SESSION_COOKIE

router = APIRouter(include_in_schema=False)


@router.get("/login", response_class=HTMLResponse)
async def login_form(next: str | None = None) -> HTMLResponse:
    return page("login.html", next=safe_next(next), problem=None)


@router.post("/login")
async def login(request: Request, gateway: GatewayDep) -> Response:
    client = request.client.host if request.client is not None else "?"
    now_s = time.monotonic()
    wait_s = gateway.throttle.wait_s(client, now_s)
    form = await read_form(request)
    target = safe_next(form.get("next"))
    if wait_s > 0:
        return page("login.html", status_code=429, next=target,
                     problem=f"Too many wrong tokens: try again in {wait_s:.0f} s.",
                     headers={"Retry-After": str(max(1, round(wait_s)))})
    if gateway.settings.gateway_token is None or not gateway.token_matches(
            form.get("token", "")):
        if gateway.settings.gateway_token is None:
            problem = "This gateway has no token configured (STREAM_JOBS_GATEWAY_TOKEN)."
        else:
            gateway.throttle.failed(client, now_s)
            problem = (f"That is not the gateway's token (after several wrong ones within "
                       f"{FAILURE_WINDOW_S:.0f} s, sign-in pauses).")
        return page("login.html", status_code=401, next=target, problem=problem)
    gateway.throttle.succeeded(client)
    gateway.sessions.end(request.cookies.get(SESSION_COOKIE))
    session = gateway.sign_in()
    assert session is not None  # a token is configured
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(SESSION_COOKIE, session.id, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", max_age=12 * 3600, path="/")
    return response


@router.post("/logout")
async def logout(request: Request, gateway: GatewayDep) -> Response:
    session = session_of(request, gateway)
    if session is not None and gateway.require_token:
        if await checked_form(request, session) is None:
            return stale_form()
        gateway.sessions.end(session.id)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response



__all__ = ["router"]
