"""`App`: the registry of job handlers, and where clients and workers come from.

```python
app = App()

@app.job("email.send", timeout=30, concurrency=64, ordering="key")
async def send_email(job: SendEmail, ctx: JobContext) -> None: ...
```
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from stream_jobs.errors import ConfigError, UnknownJobType
from stream_jobs.handlers import (
    HandlerFunc,
    JobHandler,
    Ordering,
    check_declaration,
    new_handler,
)
from stream_jobs.job_types import JobTypePolicy, get_job_type, load_job_types
from stream_jobs.settings import Settings, load_settings

if TYPE_CHECKING:
    from stream_jobs.client import JobClient, SyncJobClient
    from stream_jobs.runtime.worker import Worker

# `@app.job` hands the function back as it was, so its own type is kept.
F = TypeVar("F", bound=HandlerFunc)


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
            ordering: Ordering = "key") -> Callable[[F], F]:
        """Register a handler for `job_type`: `async def` runs on the worker's event loop,
        a plain `def` on a thread of the worker's pool (`concurrency` threads).

        `timeout` (seconds): a run past it has failed. `concurrency`: handlers of this type
        running at once in one worker. `ordering`: "key" runs one key's jobs in order and
        different keys in parallel; "partition" one at a time; "unordered" all in parallel.
        """
        check_declaration(job_type, timeout=timeout, concurrency=concurrency, ordering=ordering)

        def register(func: F) -> F:
            handler = new_handler(job_type, func, timeout=timeout, concurrency=concurrency,
                                  ordering=ordering)
            if job_type in self.handlers:
                raise ConfigError(f"Job type {job_type!r} already has a handler.")
            self.handlers[job_type] = handler
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
