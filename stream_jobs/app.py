"""`App`: the registry of job handlers, and where clients and workers come from.

```python
app = App()

@app.job("email.send", timeout=30, concurrency=64, ordering="key")
async def send_email(job: SendEmail, ctx: JobContext) -> None: ...
```
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, get_origin

import orjson
from pydantic import BaseModel, ValidationError

from stream_jobs.context import JobContext
from stream_jobs.errors import BadRecord, ConfigError, UnknownJobType
from stream_jobs.job_types import JobTypePolicy, get_job_type, load_job_types
from stream_jobs.naming import validate_job_type
from stream_jobs.settings import Settings, load_settings

if TYPE_CHECKING:
    from stream_jobs.client import JobClient, SyncJobClient
    from stream_jobs.runtime.worker import Worker

Ordering = Literal["key", "partition", "unordered"]
ORDERINGS: tuple[Ordering, ...] = ("key", "partition", "unordered")
HandlerFunc = Callable[[Any, JobContext], Awaitable[object]]


@dataclass(frozen=True)
class JobHandler:
    """A registered handler and how the worker runs it."""

    job_type: str
    func: HandlerFunc
    model: type[BaseModel] | None  # None: the payload is handed over as a dict
    timeout_s: float
    concurrency: int
    ordering: Ordering

    def parse_payload(self, raw: bytes) -> Any:
        """The handler's first argument from the record value; BadRecord when it does not fit."""
        if self.model is not None:
            try:
                return self.model.model_validate_json(raw)
            except ValidationError as exc:
                # `from None`: pydantic's own text quotes the input, and a dead letter's
                # traceback would carry the payload into headers and logs with it.
                if any(err["type"] == "json_invalid" for err in exc.errors()):
                    raise BadRecord("bad-json", f"the value is not JSON: {exc.errors()[0]['msg']}"
                                    ) from None
                raise BadRecord("invalid-payload", _validation_summary(exc)) from None
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRecord("bad-json", f"the value is not JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise BadRecord("invalid-payload",
                            f"the payload is a JSON {type(payload).__name__}, not an object")
        return payload


def _validation_summary(exc: ValidationError) -> str:
    parts = [f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}"
             for err in exc.errors()[:5]]
    return "the payload does not fit its model: " + "; ".join(parts)


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


class App:
    """Job handlers plus settings; one per deployable unit (e.g. `consumers/demo.py:app`)."""

    def __init__(self, settings: Settings | None = None, **overrides: object) -> None:
        self._settings = settings
        self._overrides = overrides
        self.handlers: dict[str, JobHandler] = {}

    @cached_property
    def settings(self) -> Settings:
        """Settings given to the constructor, else from the environment (read on first use)."""
        if self._settings is not None:
            return self._settings.model_copy(update=self._overrides)
        return load_settings(**self._overrides)

    def use_settings(self, settings: Settings) -> None:
        """Replace the settings (the CLI does this so its options and env vars win)."""
        self.__dict__["settings"] = settings

    def job(self, job_type: str, *, timeout: float = 30, concurrency: int = 64,
            ordering: Ordering = "key") -> Callable[[HandlerFunc], HandlerFunc]:
        """Register an async handler for `job_type`.

        `timeout` (seconds): a run past it has failed. `concurrency`: handlers of this type
        running at once in one worker. `ordering`: "key" runs one key's jobs in order and
        different keys in parallel; "partition" one at a time; "unordered" all in parallel.
        """
        validate_job_type(job_type)
        if ordering not in ORDERINGS:
            raise ConfigError(f"ordering must be one of {', '.join(ORDERINGS)}, not {ordering!r}.")
        if timeout <= 0 or concurrency < 1:
            raise ConfigError("timeout must be > 0 and concurrency >= 1.")

        def register(func: HandlerFunc) -> HandlerFunc:
            if not inspect.iscoroutinefunction(func):
                raise ConfigError(f"Handler {func.__qualname__} must be `async def`.")
            if job_type in self.handlers:
                raise ConfigError(f"Job type {job_type!r} already has a handler.")
            self.handlers[job_type] = JobHandler(job_type, func, _payload_model(func),
                                                 float(timeout), concurrency, ordering)
            return func

        return register

    def handler(self, job_type: str) -> JobHandler:
        try:
            return self.handlers[job_type]
        except KeyError:
            known = ", ".join(sorted(self.handlers)) or "none"
            raise UnknownJobType(f"This app has no handler for {job_type!r} (it has: {known}).") \
                from None

    def job_types(self) -> dict[str, JobTypePolicy]:
        """The declared types from `topics/` (`STREAM_JOBS_TOPICS_DIR`)."""
        return load_job_types(self.settings.topics_dir)

    def job_type(self, name: str) -> JobTypePolicy:
        return get_job_type(self.job_types(), name)

    def models(self) -> dict[str, type[BaseModel]]:
        return {t: h.model for t, h in self.handlers.items() if h.model is not None}

    def client(self) -> JobClient:
        from stream_jobs.client import JobClient

        return JobClient(self.settings, self.job_types(), models=self.models())

    def sync_client(self) -> SyncJobClient:
        from stream_jobs.client import SyncJobClient

        return SyncJobClient(self.settings, self.job_types(), models=self.models())

    def worker(self, job_type: str, **options: Any) -> Worker:
        from stream_jobs.runtime.worker import Worker

        return Worker(self.settings, self.job_type(job_type), self.handler(job_type), **options)


def load_app(spec: str) -> App:
    """Import `MODULE:ATTR` (as uvicorn does) and return the App it names."""
    import importlib
    import sys
    from pathlib import Path

    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ConfigError(f"{spec!r} is not MODULE:APP (e.g. consumers.demo:app).")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"Cannot import {module_name!r}: {exc}.") from exc
    found = getattr(module, attr or "app", None)
    if not isinstance(found, App):
        raise ConfigError(f"{spec!r} does not name a stream_jobs.App.")
    return found


__all__ = ["App", "JobHandler", "Ordering", "load_app"]
