"""What every dashboard page shares: the templates and their filters, rendering a page,
the signed-in session of a request (or the way to `/login`), and the posted form with its
CSRF check. Pages are server-rendered; a page that changes something does it through a
form that carries the session's CSRF token, and a post without it changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, PackageLoader, select_autoescape

from stream_jobs.gateway.sessions import Session
from stream_jobs.gateway.state import SESSION_COOKIE, Gateway, gateway_of

templates = Environment(loader=PackageLoader("stream_jobs.gateway", "templates"),
                        autoescape=select_autoescape(default=True), trim_blocks=True,
                        lstrip_blocks=True)
GatewayDep = Annotated[Gateway, Depends(gateway_of)]
FORM_LIMIT = 64 * 1024


def ago(seconds: float | None) -> str:
    """A duration for a person: seconds, minutes or hours."""
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def when(ms: int | None) -> str:
    """A Unix time in ms as a UTC date and time."""
    if ms is None:
        return "—"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


templates.filters["ago"] = ago
templates.filters["when"] = when


def page(name: str, status_code: int = 200, headers: dict[str, str] | None = None,
         session: Session | None = None, **context: Any) -> HTMLResponse:
    """A page; with `session`, its forms carry the session's CSRF token (`csrf`) and its
    header offers to sign out."""
    return HTMLResponse(templates.get_template(name).render(
        csrf=session.csrf if session is not None else "", signed_in=session is not None,
        **context), status_code=status_code, headers=headers)


def session_of(request: Request, gateway: Gateway) -> Session | None:
    """The request's signed-in session, or None."""
    return gateway.session_of(request.cookies.get(SESSION_COOKIE))


def stale_form() -> HTMLResponse:
    return page("problem.html", status_code=403, title="Nothing was changed",
                problem="This form is not from your current session (it is from an old "
                "page, another sign-in, or another site): open the page again and repeat.")


def to_login(request: Request) -> RedirectResponse:
    """To `/login`, and back to this page once signed in."""
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?{urlencode({'next': target})}", status_code=303)


def safe_next(target: str | None) -> str:
    """`target` if it is a path on this gateway, else `/`."""
    # Only paths on this gateway: "//host" or "https://..." would send the user away.
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return "/"


async def read_form(request: Request) -> dict[str, str]:
    """The posted form's fields, read no further than FORM_LIMIT bytes."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_LIMIT:
            raise HTTPException(413, f"A form of this dashboard is under {FORM_LIMIT} bytes.")
    fields = parse_qs(body.decode(errors="replace"), keep_blank_values=True)
    return {name: values[-1] for name, values in fields.items()}


async def checked_form(request: Request, session: Session) -> dict[str, str] | None:
    """The form, when it carries `session`'s CSRF token; None when it does not."""
    form = await read_form(request)
    return form if session.csrf_matches(form.get("csrf")) else None


__all__ = ["GatewayDep", "ago", "checked_form", "page", "read_form", "safe_next",
           "session_of", "stale_form", "templates", "to_login", "when"]
