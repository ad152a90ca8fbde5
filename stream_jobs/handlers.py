"""Handler registration: what `@app.job` records about a handler, and how a payload
becomes its first argument.

A handler's first parameter is its payload: a pydantic model (validated) or `dict`;
the model is read from the parameter's annotation when the handler is registered.
A handler is `async def` (it runs on the worker's event loop) or a plain `def` (it runs on
the worker's thread pool, `stream_jobs.runtime.threads`); both take the same options.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, get_origin

import orjson
from pydantic import BaseModel, ValidationError

from stream_jobs.context import JobContext
from stream_jobs.errors import BadRecord, ConfigError
from stream_jobs.naming import validate_job_type
from stream_jobs.outcomes import Reason
from stream_jobs.payloads import validation_summary

Ordering = Literal["key", "partition", "unordered"]
ORDERINGS: tuple[Ordering, ...] = ("key", "partition", "unordered")
AsyncHandlerFunc = Callable[[Any, JobContext], Awaitable[object]]
SyncHandlerFunc = Callable[[Any, JobContext], object]
HandlerFunc = AsyncHandlerFunc | SyncHandlerFunc


@dataclass(frozen=True)
class JobHandler:
    """A registered handler and how the worker runs it."""

    job_type: str
    func: HandlerFunc
    model: type[BaseModel] | None  # None: the payload is handed over as a dict
    timeout_s: float
    concurrency: int
    ordering: Ordering
    # A plain `def`: run on a thread of the worker's pool, not on its event loop.
    sync: bool = False

    def parse_payload(self, raw: bytes) -> Any:
        """The handler's first argument from the record value; BadRecord when it does not fit."""
        if self.model is not None:
            try:
                return self.model.model_validate_json(raw)
            except ValidationError as exc:
                # `from None`: pydantic's own text quotes the input, and a dead letter's
                # traceback would carry the payload into headers and logs with it.
                if any(err["type"] == "json_invalid" for err in exc.errors()):
                    raise BadRecord(Reason.BAD_JSON,
                                    f"the value is not JSON: {exc.errors()[0]['msg']}") from None
                raise BadRecord(Reason.INVALID_PAYLOAD, "the payload does not fit its model: "
                                + validation_summary(exc)) from None
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRecord(Reason.BAD_JSON, f"the value is not JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise BadRecord(Reason.INVALID_PAYLOAD,
                            f"the payload is a JSON {type(payload).__name__}, not an object")
        return payload


def check_declaration(job_type: str, *, timeout: float, concurrency: int,
                      ordering: Ordering) -> None:
    """`ConfigError` for `@app.job(...)` options that cannot run (before any function)."""
    validate_job_type(job_type)
    if ordering not in ORDERINGS:
        raise ConfigError(f"ordering must be one of {', '.join(ORDERINGS)}, not {ordering!r}.")
    if timeout <= 0 or concurrency < 1:
        raise ConfigError("timeout must be > 0 and concurrency >= 1.")


def new_handler(job_type: str, func: HandlerFunc, *, timeout: float, concurrency: int,
                ordering: Ordering) -> JobHandler:
    """A handler as `@app.job` registers it; `ConfigError` for a declaration that cannot run."""
    check_declaration(job_type, timeout=timeout, concurrency=concurrency, ordering=ordering)
    sync = not is_async_handler(func)
    return JobHandler(job_type, func, _payload_model(func), float(timeout), concurrency,
                      ordering, sync=sync)


def is_async_handler(func: HandlerFunc) -> bool:
    """Whether `func` is `async def` (True) or a plain `def` (False); `ConfigError` for
    what is neither (a generator's body would not run until iterated)."""
    if not (inspect.isfunction(func) or inspect.ismethod(func)):
        raise ConfigError(f"Handler {func!r} must be a function: `async def` or `def`.")
    if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
        raise ConfigError(f"Handler {func.__qualname__} is a generator: make it `async def` "
                          "or `def` and return instead of yield.")
    return inspect.iscoroutinefunction(func)


def _payload_model(func: HandlerFunc) -> type[BaseModel] | None:
    params = list(inspect.signature(func).parameters.values())
    if len(params) != 2:
        raise ConfigError(f"Handler {func.__qualname__} must take (payload, ctx).")
    try:
        hints = typing.get_type_hints(func)
    except Exception as exc:  # an annotation that cannot be resolved
        raise ConfigError(f"Handler {func.__qualname__}: cannot resolve its annotations "
                          f"({exc}).") from exc
    hint = hints.get(params[0].name, dict)
    if inspect.isclass(hint) and issubclass(hint, BaseModel):
        return hint
    if hint is dict or get_origin(hint) is dict or hint is Any:
        return None
    raise ConfigError(f"Handler {func.__qualname__}: its payload parameter must be a pydantic "
                      f"model or dict, not {hint!r}.")


