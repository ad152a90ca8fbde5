"""Bearer-token auth for the gateway's write and operator routes.

The token is `STREAM_JOBS_GATEWAY_TOKEN` (a SecretStr: never logged, never echoed). It
is compared in constant time. Read-only routes (`/types`, stats, `/metrics`, the
overview page) need none. The dashboard's DLQ pages use a session cookie set by
`/login`, holding a MAC of the token; it is HttpOnly and SameSite=Strict, so another
site cannot make a browser send it with a requeue.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from stream_jobs.errors import NotAuthorized
from stream_jobs.gateway.state import Gateway, gateway_of

bearer = HTTPBearer(auto_error=False, scheme_name="token",
                    description="The gateway's token, STREAM_JOBS_GATEWAY_TOKEN.")


async def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    gateway: Annotated[Gateway, Depends(gateway_of)],
) -> None:
    """Let the request through only with `Authorization: Bearer <token>`."""
    if not gateway.require_token:
        return
    if gateway.settings.gateway_token is None:
        raise NotAuthorized("This gateway has no token configured, so its write and operator "
                            "routes are closed: set STREAM_JOBS_GATEWAY_TOKEN and restart it.")
    if credentials is None:
        raise NotAuthorized("This route needs the gateway's token: send "
                            "`Authorization: Bearer <STREAM_JOBS_GATEWAY_TOKEN>`.")
    if not gateway.token_matches(credentials.credentials):
        raise NotAuthorized("The bearer token is not this gateway's token "
                            "(STREAM_JOBS_GATEWAY_TOKEN).")


Authorized = Depends(require_token)

__all__ = ["Authorized", "bearer", "require_token"]
