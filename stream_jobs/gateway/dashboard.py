"""The dashboard: server-rendered pages over the same tools as the JSON routes.

`/` shows every type's lanes, tiers, DLQ depth, oldest job and live workers; charts of
the last hour from the history process's windows (jobs/min, failure ratio, p95 duration
and p95 dwell per minute window, so a restarted gateway draws the same hour) and of the
lag from the gateway's own samples (since it started); the schedules (next fire, last
firing, paused, leader) and the open batches and chains (members done, failed, pending)
read from Postgres; it refreshes itself. `/ui/dlq/{type}`
browses the DLQ (reason histogram, recent letters, a letter's details) and requeues,
always through a confirmation page that shows what a dry run found. `/ui/jobs/{id}` shows
what happened to one job, with a button that cancels it (through a confirmation page)
while it has not finished. DLQ and job pages need the session `/login` starts with the
gateway's token (`sessions.py`); every form that changes something carries the session's
CSRF token, and a post without it changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from stream_jobs import clock
from stream_jobs.dlq.listing import list_letters, show_letter
from stream_jobs.dlq.requeue import requeue
from stream_jobs.errors import ConfigError, LetterNotFound, StreamJobsError
from stream_jobs.gateway.api import RequeueIn, run_requeue
from stream_jobs.gateway.charts import bar_chart, line_chart
from stream_jobs.gateway.recent import RecentHistory
from stream_jobs.gateway.sessions import FAILURE_WINDOW_S, Session
from stream_jobs.gateway.state import SESSION_COOKIE, Gateway, gateway_of
from stream_jobs.history.view import NO_HISTORY, HistoryRow
from stream_jobs.job_types import get_job_type
from stream_jobs.lookup import JobLocation, locate_job
from stream_jobs.redaction import redact_text
from stream_jobs.schedules.listing import ScheduleView, read_schedules
from stream_jobs.tools.cancel import cancel_job
from stream_jobs.workflows.progress import Progress, open_workflows

templates = Environment(loader=PackageLoader("stream_jobs.gateway", "templates"),
                        autoescape=select_autoescape(default=True), trim_blocks=True,
                        lstrip_blocks=True)
router = APIRouter(include_in_schema=False)
GatewayDep = Annotated[Gateway, Depends(gateway_of)]
_FORM_LIMIT = 64 * 1024
SCHEDULES_WAIT_S = 3.0
OPEN_BATCHES_SHOWN = 20


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _when(ms: int | None) -> str:
    if ms is None:
        return "—"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


templates.filters["ago"] = _ago
templates.filters["when"] = _when


def _page(name: str, status_code: int = 200, headers: dict[str, str] | None = None,
          session: Session | None = None, **context: Any) -> HTMLResponse:
    """A page; with `session`, its forms carry the session's CSRF token (`csrf`)."""
    return HTMLResponse(templates.get_template(name).render(
        csrf=session.csrf if session is not None else "", **context),
        status_code=status_code, headers=headers)


def _session(request: Request, gateway: Gateway) -> Session | None:
    return gateway.session_of(request.cookies.get(SESSION_COOKIE))


def _stale_form() -> HTMLResponse:
    return _page("problem.html", status_code=403, title="Nothing was changed",
                 problem="This form is not from your current session (it is from an old "
                 "page, another sign-in, or another site): open the page again and repeat.")


def _to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?{urlencode({'next': target})}", status_code=303)


def _safe_next(target: str | None) -> str:
    # Only paths on this gateway: "//host" or "https://..." would send the user away.
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return "/"


async def _form(request: Request) -> dict[str, str]:
    """The posted form's fields, read no further than _FORM_LIMIT bytes."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_LIMIT:
            raise HTTPException(413, f"A form of this dashboard is under {_FORM_LIMIT} bytes.")
    fields = parse_qs(body.decode(errors="replace"), keep_blank_values=True)
    return {name: values[-1] for name, values in fields.items()}


async def _checked_form(request: Request, session: Session) -> dict[str, str] | None:
    """The form, when it carries `session`'s CSRF token; None when it does not."""
    form = await _form(request)
    return form if session.csrf_matches(form.get("csrf")) else None


@router.get("/", response_class=HTMLResponse)
async def overview(gateway: GatewayDep) -> HTMLResponse:
    sampler = gateway.sampler
    snapshot = sampler.latest
    now_ms = clock.now_ms()
    cards = []
    for stats in snapshot.types if snapshot is not None else ():
        series = sampler.series(stats.job_type)
        cards.append({
            "stats": stats,
            "done": stats.rates.counts.done,
            "failed": stats.rates.counts.retried + stats.rates.counts.dead_lettered,
            "in_flight": sum(w.in_flight for w in stats.workers),
            "backlog": line_chart([(t, float(p.lag)) for t, p in series],
                                  title="lag since the gateway started", unit="jobs",
                                  end_ms=now_ms),
            **_history_charts(gateway.recent, stats.job_type, now_ms),
        })
    schedules, schedules_problem = await _schedules(gateway)
    batches_open, batches = await _open_batches(gateway)
    return _page("overview.html", cards=cards, snapshot=snapshot, problem=sampler.problem,
                 declared=sorted(gateway.types), refresh_s=max(2, round(sampler.interval_s)),
                 window_s=sampler.window_s, schedules=schedules,
                 schedules_problem=schedules_problem, now_ms=now_ms,
                 batches_open=batches_open, batches=batches)


def _history_charts(recent: RecentHistory, job_type: str, now_ms: int) -> dict[str, Any]:
    """The last hour from the history: charts of the closed minute windows (a window
    still open would draw a rate of its first seconds), the hour's figures, and a note
    when there is nothing to draw."""
    view = recent.views.get(job_type)
    if view is None or view.empty:
        counted = recent.totals is not None and job_type in recent.totals
        note = (f"History could not be read: {recent.problem}" if recent.problem else
                "No job finished in the last hour." if counted else
                f"No history recorded: the history process is not running (or no job has "
                f"finished yet); {NO_HISTORY}.")
        return {"history": None, "history_note": note}
    closed = [r for r in view.rows if not r.open]

    def points(value: Callable[[HistoryRow], float | None]) -> list[tuple[int, float | None]]:
        return [(r.start_ms + r.size_s * 1000, value(r)) for r in closed]

    return {"history": view.totals(), "history_note": None, "charts": [
        line_chart(points(lambda r: r.per_min), title="jobs/min", unit="/min", end_ms=now_ms),
        line_chart(points(lambda r: r.failure_ratio), title="failure ratio", unit="",
                   end_ms=now_ms, percent=True),
        line_chart(points(lambda r: r.tally.duration_s(0.95)), title="p95 duration",
                   unit="s", end_ms=now_ms),
        line_chart(points(lambda r: r.tally.dwell_s(0.95)), title="p95 dwell", unit="s",
                   end_ms=now_ms)]}


async def _open_batches(gateway: Gateway) -> tuple[int, list[Progress]]:
    """The open batches and chains, oldest first; none shown when they cannot be read (a
    deployment may have no workflow tables, and a Postgres that does not answer costs the
    page at most SCHEDULES_WAIT_S)."""
    try:
        return await asyncio.wait_for(open_workflows(gateway.settings, OPEN_BATCHES_SHOWN),
                                      SCHEDULES_WAIT_S)
    except (StreamJobsError, TimeoutError):
        return 0, []


async def _schedules(gateway: Gateway) -> tuple[list[ScheduleView], str | None]:
    """The schedules, or why they could not be read (said only when some are declared:
    a deployment without schedules may have no schedules table at all). A Postgres that
    does not answer costs the page at most SCHEDULES_WAIT_S."""
    try:
        return await asyncio.wait_for(read_schedules(gateway.settings, gateway.types),
                                      SCHEDULES_WAIT_S), None
    except (StreamJobsError, TimeoutError) as exc:
        declared = any(p.schedules for p in gateway.types.values())
        problem = (redact_text(str(exc), gateway.settings)
                   or f"Postgres did not answer within {SCHEDULES_WAIT_S:g} s")
        return [], problem if declared else None


@router.get("/login", response_class=HTMLResponse)
async def login_form(next: str | None = None) -> HTMLResponse:
    return _page("login.html", next=_safe_next(next), problem=None)


@router.post("/login")
async def login(request: Request, gateway: GatewayDep) -> Response:
    client = request.client.host if request.client is not None else "?"
    now_s = time.monotonic()
    wait_s = gateway.throttle.wait_s(client, now_s)
    form = await _form(request)
    target = _safe_next(form.get("next"))
    if wait_s > 0:
        return _page("login.html", status_code=429, next=target,
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
        return _page("login.html", status_code=401, next=target, problem=problem)
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
    session = _session(request, gateway)
    if session is not None and gateway.require_token:
        if await _checked_form(request, session) is None:
            return _stale_form()
        gateway.sessions.end(session.id)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/ui/dlq/{job_type}", response_class=HTMLResponse)
async def dlq_page(request: Request, job_type: str, gateway: GatewayDep,
                   reason: str | None = None, done: str | None = None) -> Response:
    if (session := _session(request, gateway)) is None:
        return _to_login(request)
    get_job_type(gateway.types, job_type)
    listing = await list_letters(gateway.settings, job_type, reason=reason or None, limit=50)
    histogram = bar_chart(list(listing.job_reasons.items()), title="jobs by reason")
    return _page("dlq.html", listing=listing, histogram=histogram, reason=reason or "",
                 done=done, rows=list(reversed(listing.rows)), quote=quote,
                 session=session)


@router.get("/ui/dlq/{job_type}/letters/{job_id}", response_class=HTMLResponse)
async def letter_page(request: Request, job_type: str, job_id: str,
                      gateway: GatewayDep) -> Response:
    if (session := _session(request, gateway)) is None:
        return _to_login(request)
    get_job_type(gateway.types, job_type)
    letter = await show_letter(gateway.settings, job_type, job_id)
    return _page("letter.html", letter=letter, quote=quote, session=session)


@router.get("/ui/dlq/{job_type}/requeue", response_class=HTMLResponse)
async def confirm_requeue(request: Request, job_type: str, gateway: GatewayDep,
                          id: str | None = None, reason: str | None = None) -> Response:
    """What a requeue would do (a dry run), with the button that does it."""
    if (session := _session(request, gateway)) is None:
        return _to_login(request)
    get_job_type(gateway.types, job_type)
    body = _selection(id, reason)
    result = await requeue(gateway.settings, job_type, select=body.selection(), dry_run=True)
    return _page("confirm.html", job_type=job_type, job_id=id or "", reason=reason or "",
                 plan=result.plan, session=session)


@router.post("/ui/dlq/{job_type}/requeue")
async def do_requeue(request: Request, job_type: str, gateway: GatewayDep) -> Response:
    if (session := _session(request, gateway)) is None:
        return _to_login(request)
    get_job_type(gateway.types, job_type)
    if (form := await _checked_form(request, session)) is None:
        return _stale_form()
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


_CANCELLABLE = ("pending", "retrying", "scheduled")


async def _located(gateway: Gateway, job_id: str, job_type: str | None) -> JobLocation:
    if job_type:
        get_job_type(gateway.types, job_type)
    # A done job's records too: the page lists them and shows its trace ID.
    return await locate_job(gateway.settings, gateway.types, job_id, job_type=job_type or None,
                            records_of_done=True)


@router.get("/ui/jobs")
async def find_job(id: str | None = None) -> Response:
    """The overview's search box: to the job's page."""
    target = f"/ui/jobs/{quote(id.strip(), safe='')}" if id and id.strip() else "/"
    return RedirectResponse(target, status_code=303)


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(request: Request, job_id: str, gateway: GatewayDep,
                   type: str | None = None, done: str | None = None) -> Response:
    if (session := _session(request, gateway)) is None:
        return _to_login(request)
    found = await _located(gateway, job_id, type)
    return _page("job.html", found=found, done=done, quote=quote,
                 cancellable=found.status in _CANCELLABLE, session=session)


@router.get("/ui/jobs/{job_id}/cancel", response_class=HTMLResponse)
async def confirm_cancel(request: Request, job_id: str, gateway: GatewayDep,
                         type: str | None = None) -> Response:
    """What the job is doing now, with the button that cancels it."""
    if (session := _session(request, gateway)) is None:
        return _to_login(request)
    found = await _located(gateway, job_id, type)
    return _page("cancel.html", found=found, quote=quote, session=session)


@router.post("/ui/jobs/{job_id}/cancel")
async def do_cancel(request: Request, job_id: str, gateway: GatewayDep) -> Response:
    if (session := _session(request, gateway)) is None:
        return _to_login(request)
    if (form := await _checked_form(request, session)) is None:
        return _stale_form()
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


def _selection(job_id: str | None, reason: str | None) -> RequeueIn:
    if job_id:
        return RequeueIn(ids=[job_id])
    if reason:
        return RequeueIn(reason=reason)
    raise ConfigError("Choose a letter (id) or a reason to requeue.")


__all__ = ["router", "templates"]
