"""`Guard`: what every request passes before a route runs, and what every answer carries.

Before the route, in this order, each refusal one sentence:

1. the `Host` header is one the gateway answers to (`origins.AllowedHosts`), else 400;
2. a request that may change something did not come from another origin's page
   (`origins.cross_origin`), else 403;
3. a route that needs the token (`dependencies=[Authorized]`) has it, else 401, decided
   from the headers alone: the body of a request without the token is never read.

Every answer carries the headers that keep the pages from being framed, sniffed, cached
or made to run a script they did not ship (`SECURITY_HEADERS`).
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stream_jobs.gateway.auth import require_token, token_problem
from stream_jobs.gateway.origins import cross_origin, origin_of
from stream_jobs.gateway.state import Gateway

# No script but the gateway's own files (no inline script), no framing by anyone, forms
# post only to the gateway; styles may be inline (the pages' own <style>, Swagger UI's).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'")
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
# Pages and answers show payloads, errors and job IDs: no cache keeps them.
NO_STORE = (b"cache-control", b"no-store")


def _needs_token(route: BaseRoute) -> bool:
    if not isinstance(route, APIRoute):
        return False
    pending = list(route.dependant.dependencies)
    while pending:
        dependency = pending.pop()
        if dependency.call is require_token:
            return True
        pending.extend(dependency.dependencies)
    return False


class Guard:
    def __init__(self, app: ASGIApp, gateway: Gateway, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self.gateway = gateway
        self._routes = routes
        self._token_routes: list[BaseRoute] | None = None

    def _token_route(self, scope: Scope) -> bool:
        if self._token_routes is None:
            self._token_routes = [route for route in self._routes if _needs_token(route)]
        return any(route.matches(scope)[0] is Match.FULL for route in self._token_routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(name.decode("latin-1"), value.decode("latin-1"))
                   for name, value in scope["headers"]]
        host = next((value for name, value in headers if name == "host"), None)

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent = list(message.get("headers", []))
                names = {name.lower() for name, _ in sent}
                sent.extend(header for header in SECURITY_HEADERS if header[0] not in names)
                if NO_STORE[0] not in names:
                    sent.append(NO_STORE)
                message = {**message, "headers": sent}
            await send(message)

        refusal = self._refusal(scope, host, headers)
        if refusal is not None:
            status, detail, extra = refusal
            # Connection: close, so the server drops the connection with the body unread
            # instead of reading (and discarding) all of it to keep the connection alive.
            await JSONResponse({"detail": detail}, status_code=status,
                               headers={**extra, "Connection": "close"})(
                scope, nothing_to_read, send_guarded)
            return
        await self.app(scope, receive, send_guarded)

    def _refusal(self, scope: Scope, host: str | None, headers: list[tuple[str, str]]
                 ) -> tuple[int, str, dict[str, str]] | None:
        allowed = self.gateway.allowed_hosts
        if not allowed.allows(host):
            shown = (host or "")[:100].encode("ascii", "backslashreplace").decode()
            return (400, f"This gateway does not answer to the host {shown!r} "
                    f"(STREAM_JOBS_GATEWAY_ALLOWED_HOSTS: {allowed.describe()}).", {})
        own = origin_of(str(scope.get("scheme", "http")), host or "")
        why = cross_origin(str(scope["method"]), own, headers)
        if why is not None:
            return 403, why, {}
        if self._token_route(scope):
            authorization = next((value for name, value in headers
                                  if name == "authorization"), None)
            problem = token_problem(self.gateway, authorization)
            if problem is not None:
                return 401, problem, {"WWW-Authenticate": "Bearer"}
        return None


async def nothing_to_read() -> Message:
    """The `receive` of an answer given without reading the request."""
    return {"type": "http.disconnect"}


__all__ = ["CONTENT_SECURITY_POLICY", "SECURITY_HEADERS", "Guard", "nothing_to_read"]
