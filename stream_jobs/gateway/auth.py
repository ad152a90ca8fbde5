"""Bearer-token auth for the gateway's write and operator routes.

The token is `STREAM_JOBS_GATEWAY_TOKEN` (a SecretStr: never logged, never echoed). It
is compared in constant time. Read-only routes (`/types`, stats, `/metrics`, the
overview page) need none. A route that needs it says so with `dependencies=[Authorized]`;
the guard (`guard.py`) checks the token of such a route before anything reads the
request's body, so a request without it costs the gateway its headers only. The
dashboard's pages use the session `/login` starts instead (`sessions.py`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from stream_jobs.errors import NotAuthorized
from stream_jobs.gateway.state import Gateway, gateway_of

bearer = HTTPBearer(auto_error=False, scheme_name="token",
                    description="The gateway's token, STREAM_JOBS_GATEWAY_TOKEN.")


def token_problem(gateway: Gateway, authorization: str | None) -> str | None:
    """Why a request with this `Authorization` header may not use a token route (one
    sentence), or None when it may. The one place of the rule."""
    if not gateway.require_token:
        return None
    if gateway.settings.gateway_token is None:
        return ("This gateway has no token configured, so its write and operator routes "
                "are closed: set STREAM_JOBS_GATEWAY_TOKEN and restart it.")
    scheme, _, credentials = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return ("This route needs the gateway's token: send "
                "`Authorization: Bearer <STREAM_JOBS_GATEWAY_TOKEN>`.")
    if not gateway.token_matches(credentials.strip()):
        return "The bearer token is not this gateway's token (STREAM_JOBS_GATEWAY_TOKEN)."
    return None


async def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    gateway: Annotated[Gateway, Depends(gateway_of)],
) -> None:
    """Let the request through only with `Authorization: Bearer <token>` (the guard has
    already checked it; this names the route's security scheme in the OpenAPI schema)."""
    problem = token_problem(gateway, request.headers.get("authorization"))
    if problem is not None:
        raise NotAuthorized(problem)


Authorized = Depends(require_token)

__all__ = ["Authorized", "bearer", "require_token", "token_problem"]
