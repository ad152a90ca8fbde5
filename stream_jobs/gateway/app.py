"""`create_app`: the gateway as an ASGI app (FastAPI), run by `stream-jobs serve`.

One `JobClient` lives as long as the app (its producer stays connected), and background
tasks sample stats and read the recent history for `/metrics` and the dashboard. Errors
of ours become HTTP answers here, one sentence each: UnknownJobType, LetterNotFound, JobNotFound and
UnknownWorkflow 404, CancelPending, NotInDelayTier and AlreadyReleased 409,
PayloadTooLarge 413, PayloadError and ConfigError 422, Kafka not answering 503 with
Retry-After, NotAuthorized 401.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stream_jobs.errors import (
    AccessDenied,
    AlreadyReleased,
    AuthenticationFailed,
    BrokerUnavailable,
    CancelPending,
    ConfigError,
    DatabaseUnavailable,
    DlqRefused,
    JobNotFound,
    LetterNotFound,
    NotAuthorized,
    NotInDelayTier,
    PayloadError,
    PayloadTooLarge,
    PublishError,
    StreamJobsError,
    UnknownJobType,
    UnknownWorkflow,
)
from stream_jobs.gateway import api, history_api, pages, retry_now_api
from stream_jobs.gateway.api_docs import mount_api_docs
from stream_jobs.gateway.guard import Guard, nothing_to_read
from stream_jobs.gateway.origins import AllowedHosts
from stream_jobs.gateway.recent import RecentHistory
from stream_jobs.gateway.sampler import StatsSampler
from stream_jobs.gateway.state import Enqueuer, Gateway
from stream_jobs.job_types import load_job_types
from stream_jobs.runtime.metrics import CONTENT_TYPE
from stream_jobs.settings import Settings

Handler = Callable[[Request, Any], Coroutine[Any, Any, Response]]
_UNAVAILABLE = (BrokerUnavailable, PublishError, DatabaseUnavailable, AuthenticationFailed,
                AccessDenied, DlqRefused)


class BodyLimit:
    """Refuses request bodies over `limit` bytes with 413 before anything parses them (by
    Content-Length, and by counting when the client streams without one), and counts
    answers by route template and status for `/metrics`."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.gateway.settings.gateway_max_body_bytes
        status = 500
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await JSONResponse({"detail": _too_large(limit)}, status_code=413,
                               headers={"Connection": "close"})(
                scope, nothing_to_read, send)
            self._count(scope, 413)
            return
        seen = 0

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # FastAPI passes an HTTPException from reading the body through as is.
                    raise HTTPException(413, _too_large(limit))
            return message

        async def watched_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        finally:
            self._count(scope, status)

    def _count(self, scope: Scope, status: int) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or "unmatched"
        self.gateway.requests.labels(path, str(status)).inc()


def _too_large(limit: int) -> str:
    return (f"The request body is over {limit} bytes (STREAM_JOBS_GATEWAY_MAX_BODY_BYTES): "
            "send fewer jobs per request, or store large data elsewhere and enqueue a "
            "reference.")


def _printable(value: object) -> str | int:
    if isinstance(value, int):
        return value
    return str(value).encode("utf-8", "backslashreplace").decode()


def _message(error: Mapping[str, Any]) -> str | int:
    """A validation error's sentence; for a body that is not JSON, with the parser's reason
    (a lone surrogate, NaN, where it stopped), which names no input."""
    why = (error.get("ctx") or {}).get("error") if error["type"] == "json_invalid" else None
    if isinstance(why, str) and why:
        return _printable(f"The body is not strict JSON: {why}.")
    return _printable(error["msg"])


def _problem(status: int, exc: StreamJobsError, headers: dict[str, str] | None = None
             ) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)


def _handlers(gateway: Gateway) -> dict[Any, Handler]:
    retry_after = {"Retry-After": str(gateway.settings.gateway_retry_after_s)}

    async def not_authorized(_: Request, exc: NotAuthorized) -> Response:
        return _problem(401, exc, {"WWW-Authenticate": "Bearer"})

    async def not_found(_: Request, exc: StreamJobsError) -> Response:
        return _problem(404, exc)

    async def too_large(_: Request, exc: PayloadTooLarge) -> Response:
        return _problem(413, exc)

    async def conflict(_: Request, exc: StreamJobsError) -> Response:
        return _problem(409, exc)

    async def unprocessable(_: Request, exc: StreamJobsError) -> Response:
        # The shape of FastAPI's own 422, so a client reads every 422 alike.
        return JSONResponse({"detail": [{"loc": ["body"], "msg": str(exc),
                                         "type": type(exc).__name__}]}, status_code=422)

    async def invalid_request(_: Request, exc: RequestValidationError) -> Response:
        # FastAPI's shape, without echoing the input: it may hold a payload's secrets, or
        # text that is not valid UTF-8 (lone surrogates), which cannot be rendered.
        return JSONResponse({"detail": [
            {"loc": [_printable(part) for part in error["loc"]], "msg": _message(error),
             "type": error["type"]} for error in exc.errors()]}, status_code=422)

    async def unavailable(_: Request, exc: StreamJobsError) -> Response:
        return _problem(503, exc, retry_after)

    handlers: dict[Any, Handler] = {
        NotAuthorized: not_authorized, UnknownJobType: not_found, LetterNotFound: not_found,
        JobNotFound: not_found, CancelPending: conflict, UnknownWorkflow: not_found,
        NotInDelayTier: conflict, AlreadyReleased: conflict,
        PayloadTooLarge: too_large, PayloadError: unprocessable, ConfigError: unprocessable,
        RequestValidationError: invalid_request,
    }
    handlers.update({kind: unavailable for kind in _UNAVAILABLE})
    return handlers


def _lifespan(gateway: Gateway, *, sample: bool, history: bool
              ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What runs beside the routes: the stats sampler and the history reader (unless
    `sample` is off), the history process itself with `history`; stopped in reverse."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        with contextlib.suppress(StreamJobsError):
            await gateway.enqueuer.client()  # warm now; if Kafka is down, on first use
        sampling = [asyncio.create_task(gateway.sampler.run()),
                    asyncio.create_task(gateway.recent.run())] if sample else []
        history_stop = asyncio.Event()
        keeping = None
        if history:
            from stream_jobs.history.process import keep_history  # faust: only with history
            keeping = asyncio.create_task(keep_history(gateway.settings, history_stop))
        try:
            yield
        finally:
            if keeping is not None:
                history_stop.set()
                await keeping
            for task in sampling:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await gateway.recent.close()
            await gateway.enqueuer.close()

    return lifespan


def create_app(settings: Settings, *, models: Mapping[str, type[BaseModel]] | None = None,
               require_token: bool = True, sample: bool = True,
               host: str | None = None, history: bool = False) -> FastAPI:
    """The gateway for the types declared in `settings.topics_dir` (read once, at start).

    `models` (job type -> pydantic model, e.g. `App.models()`) makes enqueue check payloads
    the way the handlers will. `require_token=False` opens every route (only for a
    gateway that nobody else can reach). `sample=False` skips the background stats
    and history reading.
    `host` is the address it listens on: with STREAM_JOBS_GATEWAY_ALLOWED_HOSTS empty,
    it answers to that, localhost, 127.0.0.1 and ::1 (any IP address for 0.0.0.0 / ::).
    `history=True` runs the history process inside the gateway (`serve --history`).
    """
    types = load_job_types(settings.topics_dir)
    gateway = Gateway(settings, types, Enqueuer(settings, types, models or {}),
                      StatsSampler(settings, types,
                                   interval_s=settings.gateway_sample_interval_s),
                      RecentHistory(settings, types,
                                    interval_s=settings.gateway_sample_interval_s),
                      require_token=require_token,
                      allowed_hosts=AllowedHosts.of(settings.gateway_allowed_hosts, host))

    lifespan = _lifespan(gateway, sample=sample, history=history)
    app = FastAPI(title="stream-jobs gateway", version="1",
                  description="Enqueue jobs over HTTP, look them up, watch the queues and "
                  "work the DLQ. Write and operator routes need `Authorization: Bearer "
                  "<STREAM_JOBS_GATEWAY_TOKEN>`.",
                  lifespan=lifespan, exception_handlers=_handlers(gateway),
                  # /docs is served from the package (api_docs.py); no ReDoc, no OAuth.
                  docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None)
    app.state.gateway = gateway
    mount_api_docs(app)
    app.include_router(api.router)
    app.include_router(history_api.router)
    app.include_router(retry_now_api.router)
    for router in pages.routers:
        app.include_router(router)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(gateway.registry), media_type=CONTENT_TYPE)

    # Outermost last: a trusted proxy's headers first, then the limits, then the guard.
    # The guard reads the token routes off the API's own router (included without a prefix).
    app.add_middleware(Guard, gateway=gateway, routes=api.router.routes)
    app.add_middleware(BodyLimit, gateway=gateway)
    proxies = [p.strip() for p in settings.gateway_trusted_proxies.split(",") if p.strip()]
    if proxies:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=proxies)
    return app


__all__ = ["create_app"]
