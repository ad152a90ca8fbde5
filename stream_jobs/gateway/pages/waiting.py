"""`/ui/types/{type}/pending|scheduled|retrying|dead`: a type's jobs by state, paged
(`stream_jobs.waiting`). Needs a signed-in session. A page size (`?size=`, up to 500)
or a cursor (`?after=`) this list did not give out is a clear 400 page."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from stream_jobs.errors import BadCursor, ConfigError
from stream_jobs.gateway.pages.common import GatewayDep, page, session_of, to_login
from stream_jobs.gateway.state import Gateway
from stream_jobs.job_types import get_job_type
from stream_jobs.waiting import (
    DEFAULT_PAGE_SIZE,
    STATES,
    DeadPage,
    State,
    WaitingPage,
    page_size,
    waiting_page,
)

router = APIRouter(include_in_schema=False)

TITLES: dict[State, str] = {"pending": "Waiting", "scheduled": "Scheduled",
                            "retrying": "Retrying", "dead": "Dead"}


async def _listing(gateway: Gateway, job_type: str, state: State, after: str | None,
                   size: int) -> WaitingPage | DeadPage:
    policy = get_job_type(gateway.types, job_type)
    if state == "dead":
        return await gateway.dead_jobs.page(gateway.settings, policy, after=after, size=size)
    return await waiting_page(gateway.settings, policy, state, after=after, size=size)


def _link(job_type: str, state: State, size: int, after: str | None) -> str:
    query = {**({"size": str(size)} if size != DEFAULT_PAGE_SIZE else {}),
             **({"after": after} if after else {})}
    return f"/ui/types/{quote(job_type, safe='')}/{state}" + (
        f"?{urlencode(query)}" if query else "")


async def _render(request: Request, gateway: Gateway, job_type: str, state: State,
                  after: str | None, size: str | None) -> Response:
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    try:
        chosen = page_size(size)
        listing = await _listing(gateway, job_type, state, after or None, chosen)
    except (BadCursor, ConfigError) as exc:
        return page("problem.html", status_code=400, title="No such page", problem=str(exc),
                    session=session, current="/")
    return page("waiting.html", listing=listing, state=state, title=TITLES[state],
                first_link=_link(job_type, state, chosen, None),
                next_link=(_link(job_type, state, chosen, listing.next_cursor)
                           if listing.next_cursor else None),
                quote=quote, session=session, current="/")


def _route(state: State) -> Callable[..., Awaitable[Response]]:
    async def listed(request: Request, job_type: str, gateway: GatewayDep,
                     after: str | None = None, size: str | None = None) -> Response:
        return await _render(request, gateway, job_type, state, after, size)

    listed.__name__ = f"{state}_page"
    return listed


for _state in STATES:
    router.add_api_route(f"/ui/types/{{job_type}}/{_state}", _route(_state),
                         methods=["GET"], response_class=HTMLResponse)


__all__ = ["router"]
