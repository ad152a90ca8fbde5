"""`App`: the registry of job handlers, and where clients and workers come from.

```python
app = App()

@app.job("email.send", timeout=30, concurrency=64, ordering="key")
async def send_email(job: SendEmail, ctx: JobContext) -> None: ...

@app.periodic("digest.send", name="hourly", cron="0 * * * *", timezone="Europe/Berlin")
def hourly_digest(fire_time: datetime) -> dict[str, str]: ...
```
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, TypeVar, Unpack

from pydantic import BaseModel, ValidationError

from stream_jobs.durations import parse_duration
from stream_jobs.errors import ConfigError, UnknownJobType
from stream_jobs.handlers import (
    HandlerFunc,
    JobHandler,
    Ordering,
    check_declaration,
    new_handler,
)
from stream_jobs.job_types import JobTypePolicy, get_job_type, load_job_types
from stream_jobs.kafka.clients import AIOKAFKA, KafkaClients
from stream_jobs.naming import validate_job_type
from stream_jobs.payloads import validation_summary
from stream_jobs.periodic import MissedPolicy, ScheduleSpec, every_seconds
from stream_jobs.settings import Settings, load_settings

if TYPE_CHECKING:
    from stream_jobs.client import JobClient, SyncJobClient
    from stream_jobs.runtime.worker import Worker
    from stream_jobs.runtime.worker_options import WorkerOptions
    from stream_jobs.schedules import PayloadFunc, Scheduler
    from stream_jobs.storage import Storage

# `@app.job` hands the function back as it was, so its own type is kept.
F = TypeVar("F", bound=HandlerFunc)


class App:
    """Job handlers plus settings; one per deployable unit (e.g. `consumers/demo.py:app`)."""

    def __init__(self, settings: Settings | None = None, **overrides: object) -> None:
        self._settings = settings
        self._overrides = overrides
        self.handlers: dict[str, JobHandler] = {}
        # Schedules declared in code: type -> name -> (spec, payload function).
        self.periodic_jobs: dict[str, dict[str, tuple[ScheduleSpec, PayloadFunc]]] = {}
        # Where the app's clients, workers and schedulers get their Kafka clients: the
        # real ones, or a JobTester's in-memory broker while one runs (stream_jobs.testing).
        self.kafka: KafkaClients = AIOKAFKA
        # Where its workers and clients keep what is not in Kafka (stream_jobs.storage):
        # Postgres, made on first use (None until then), or a JobTester's memory.
        self._storage: Storage | None = None
        # Types declared in code instead of topics/ (a JobTester's `types=` while it runs).
        self.declared_types: dict[str, JobTypePolicy] | None = None

    @property
    def storage(self) -> Storage:
        """The app's `Storage`: one per app, so its workers share one cancel watch."""
        from stream_jobs.storage import PostgresStorage

        stale = isinstance(self._storage, PostgresStorage) and \
            self._storage.settings is not self.settings  # made before use_settings()
        if self._storage is None or stale:
            self._storage = PostgresStorage(self.settings)
        return self._storage

    def use_storage(self, storage: Storage | None) -> Storage | None:
        """Put `storage` in the app's place (None: Postgres again); the one it replaced."""
        previous, self._storage = self._storage, storage
        return previous

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
            ordering: Ordering = "key", keep_result: str | float | timedelta | None = None
            ) -> Callable[[F], F]:
        """Register a handler for `job_type`: `async def` runs on the worker's event loop,
        a plain `def` on a thread of the worker's pool (`concurrency` threads).

        `timeout` (seconds): a run past it has failed. `concurrency`: handlers of this type
        running at once in one worker. `ordering`: "key" runs one key's jobs in order and
        different keys in parallel; "partition" one at a time; "unordered" all in parallel.
        `keep_result` ("1d", seconds or a timedelta): keep what the handler returns, for
        that long, committed with the job's dedup row (`client.result`, docs/results.md).
        """
        check_declaration(job_type, timeout=timeout, concurrency=concurrency, ordering=ordering)
        keep_s = _keep_seconds(job_type, keep_result)

        def register(func: F) -> F:
            handler = new_handler(job_type, func, timeout=timeout, concurrency=concurrency,
                                  ordering=ordering, keep_result_s=keep_s)
            if job_type in self.handlers:
                raise ConfigError(f"Job type {job_type!r} already has a handler.")
            self.handlers[job_type] = handler
            return func

        return register

    def periodic(self, job_type: str, *, name: str, cron: str | None = None,
                 every: str | float | timedelta | None = None, timezone: str = "UTC",
                 missed: MissedPolicy = "latest") -> Callable[[PayloadFunc], PayloadFunc]:
        """Register a schedule of `job_type` whose payload is computed at fire time.

        `cron` (five fields, on `timezone`'s wall clock) or `every` ("5m", seconds, or a
        timedelta), and `missed` mean what they mean in `[[schedules]]` of topics/T.toml.
        The function gets the firing's scheduled time (aware, on the schedule's clock)
        and returns the payload (a dict or a pydantic model), or an awaitable of it. It
        may be called more than once for one firing (a retry, a failover); only one of
        its results runs, under the firing's job ID, so it should compute, not act.
        """
        validate_job_type(job_type)
        every_s = every.total_seconds() if isinstance(every, timedelta) else \
            None if every is None else every_seconds(name, every)
        spec = ScheduleSpec(name, cron=cron, every_s=every_s, timezone=timezone,
                            missed=missed, in_code=True)

        def register(func: PayloadFunc) -> PayloadFunc:
            declared = self.periodic_jobs.setdefault(job_type, {})
            if name in declared:
                raise ConfigError(f"Job type {job_type!r} already has a schedule {name!r} "
                                  "declared in code.")
            where = f"@app.periodic on {func.__module__}.{func.__qualname__}"
            declared[name] = (replace(spec, source=where), func)
            return func

        return register

    def schedules(self, job_type: str, *,
                  policy: JobTypePolicy | None = None) -> tuple[ScheduleSpec, ...]:
        """The type's schedules: its `[[schedules]]` (in `policy`, default: topics/), then
        those declared in code."""
        policy = policy or self.job_type(job_type)
        in_code = [spec for spec, _ in self.periodic_jobs.get(job_type, {}).values()]
        for spec in in_code:
            if any(s.name == spec.name for s in policy.schedules):
                raise ConfigError(f"Schedule {spec.name!r} of {job_type!r} is declared in "
                                  f"{policy.origin} and by {spec.source}; keep one.")
        return (*policy.schedules, *in_code)

    def scheduled_types(self) -> list[str]:
        """The declared types that have schedules, in TOML or in code."""
        types = self.job_types()
        return sorted(t for t, p in types.items() if p.schedules or self.periodic_jobs.get(t))

    def scheduler(self, job_type: str, *, policy: JobTypePolicy | None = None,
                  lease_s: float | None = None, holder: str | None = None,
                  kafka: KafkaClients | None = None) -> Scheduler | None:
        """The scheduler of `job_type` (None when it has no schedules). A TOML payload
        that does not fit the handler's model is refused here, before anything fires.
        `lease_s`, `holder` and `kafka` (default: the app's) mean what `Scheduler`'s do."""
        from stream_jobs.schedules import Scheduler

        policy = policy or self.job_type(job_type)
        specs = self.schedules(job_type, policy=policy)
        if not specs:
            return None
        models = self.models()
        model = models.get(job_type)
        for spec in specs:
            if model is not None and not spec.in_code:
                try:
                    model.model_validate(spec.payload)
                except ValidationError as exc:
                    raise ConfigError(f"{policy.origin}: the payload of schedule {spec.name!r} "
                                      f"does not fit {model.__name__}: "
                                      f"{validation_summary(exc)}.") from exc
        payloads = {name: func for name, (_, func) in self.periodic_jobs.get(job_type, {}).items()}
        clients = self.kafka if kafka is None else kafka

        def client() -> JobClient:
            from stream_jobs.client import JobClient

            return JobClient(self.settings, {job_type: policy}, models=models, kafka=clients)

        return Scheduler(self.settings, policy, specs, client=client, payloads=payloads,
                         lease_s=lease_s, holder=holder)

    def handler(self, job_type: str) -> JobHandler:
        try:
            return self.handlers[job_type]
        except KeyError:
            known = ", ".join(sorted(self.handlers)) or "none"
            raise UnknownJobType(f"This app has no handler for {job_type!r} (it has: {known}).") \
                from None

    def job_types(self) -> dict[str, JobTypePolicy]:
        """The declared types from `topics/` (`STREAM_JOBS_TOPICS_DIR`), or those declared
        in code (`declared_types`)."""
        if self.declared_types is not None:
            return dict(self.declared_types)
        return load_job_types(self.settings.topics_dir)

    def job_type(self, name: str) -> JobTypePolicy:
        return get_job_type(self.job_types(), name)

    def models(self) -> dict[str, type[BaseModel]]:
        return {t: h.model for t, h in self.handlers.items() if h.model is not None}

    def kept_results(self) -> dict[str, float | None]:
        """Seconds each type this app has a handler for keeps its results (None: it has
        no `keep_result`); `client.result` tells the two apart from a type it has no
        handler of."""
        return {t: h.keep_result_s for t, h in self.handlers.items()}

    def client(self) -> JobClient:
        from stream_jobs.client import JobClient

        return JobClient(self.settings, self.job_types(), models=self.models(), kafka=self.kafka,
                         kept=self.kept_results(), stores=self.storage.client_stores())

    def sync_client(self) -> SyncJobClient:
        from stream_jobs.client import SyncJobClient

        return SyncJobClient(self.settings, self.job_types(), models=self.models(),
                             kafka=self.kafka, kept=self.kept_results(),
                             stores=self.storage.client_stores())

    def worker(self, job_type: str, **options: Unpack[WorkerOptions]) -> Worker:
        """The worker of `job_type`, with the app's client for child jobs, its Kafka
        clients and the type's scheduler unless `options` give others (`Worker`'s)."""
        from stream_jobs.runtime.worker import Worker

        options.setdefault("children", self.client())  # for ctx.enqueue(): every type's checks
        options.setdefault("storage", self.storage)
        options.setdefault("kafka", self.kafka)
        # Every worker of a type runs its scheduler; one of them leads (docs/schedules.md).
        options.setdefault("scheduler", self.scheduler(job_type))
        return Worker(self.settings, self.job_type(job_type), self.handler(job_type), **options)


def _keep_seconds(job_type: str, keep: str | float | timedelta | None) -> float | None:
    if keep is None:
        return None
    seconds = keep.total_seconds() if isinstance(keep, timedelta) else parse_duration(keep)
    if seconds <= 0:
        raise ConfigError(f"keep_result of {job_type!r} must be longer than 0 (e.g. '1d').")
    return seconds


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
