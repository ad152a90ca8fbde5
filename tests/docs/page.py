"""One manual page's corner of the stack, for its samples: its own topic prefix, Postgres
schema, environment and event loop.

A page's samples run as a newcomer runs them: `App()` reads the `STREAM_JOBS_*`
environment, which points at the page's prefix and schema while the page runs (and is put
back afterwards). The schema is not made in advance (a newcomer's `stream-jobs db migrate`
makes it); it is dropped, and the page's topics deleted, when the page ends.

A page's hidden blocks (`<!-- invisible-code-block: python ... -->`) reach this object as
`page`: `await page.migrate(...)` for the dedup tables and the page's own, `await
page.declare()` for the types the page uses, `await page.drain(app)` to run an app's
workers until nothing of it is left to do.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from stream_jobs.app import App
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.admin import admin_client
from stream_jobs.kafka.topics import apply
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.runtime.host import WorkerHost, process_services
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import (
    TestStack,
    choose_backend,
    drop_schema,
    external_stack,
    fresh_prefix,
    local_stack,
    run_async,
)

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

_stack: list[TestStack] = []


def the_stack() -> TestStack:
    """The run's Kafka and Postgres: the local stack, or the services the environment names
    (the manual's samples need a stack that outlives one page: not testcontainers)."""
    if not _stack:
        backend = choose_backend(os.environ)
        _stack.append(external_stack(os.environ) if backend == "external" else local_stack())
    return _stack[0]


class ModuleView:
    """Stands in `sys.modules` for a page: its namespace is the module's `__dict__`, so
    pydantic and `typing.get_type_hints` resolve a sample's names as they would in a file."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.__dict__ = namespace


class Page:
    """A page's prefix, schema, environment and loop, from its first sample to its end."""

    def __init__(self, path: Path, namespace: dict[str, Any]) -> None:
        self.path = path
        self.namespace = namespace
        stack = the_stack()
        self.prefix = fresh_prefix()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"manual-{path.stem}-"))
        self.topics_dir = REPO / "topics"
        self.env = {
            "STREAM_JOBS_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
            "STREAM_JOBS_DATABASE_URL": stack.database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": self.prefix,
            "STREAM_JOBS_TOPIC_PREFIX": self.prefix,
            "STREAM_JOBS_TOPICS_DIR": str(self.topics_dir),
        }
        self._saved_env: dict[str, str | None] = {}
        # Where the page's shell commands run: the repository, as a reader's checkout.
        self.cwd = REPO
        self._closers: list[Callable[[], None]] = []
        self.module = f"manual_{path.stem.replace('-', '_')}_{self.prefix}"
        self._runner = asyncio.Runner()

    # -- the page's life ------------------------------------------------------------------

    def open(self) -> None:
        for name, value in self.env.items():
            self._saved_env[name] = os.environ.get(name)
            os.environ[name] = value
        self.namespace.update(__name__=self.module, page=self)
        sys.modules[self.module] = ModuleView(self.namespace)  # type: ignore[assignment]

    def on_close(self, closer: Callable[[], None]) -> None:
        """Call `closer` when the page ends (before its environment is put back)."""
        self._closers.append(closer)

    def close(self) -> None:
        settings = self.settings()
        try:
            for closer in reversed(self._closers):
                closer()
        finally:
            self._close(settings)

    def _close(self, settings: Settings) -> None:
        try:
            self._runner.close()
        finally:
            sys.modules.pop(self.module, None)
            for name, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            run_async(lambda: drop_schema(settings))
            run_async(lambda: drop_topics(settings))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a sample's top-level awaits on the page's loop (one loop per page, so a
        client opened in one sample is usable in the next)."""
        return self._runner.run(coroutine)

    def use_env(self, **names: str) -> None:
        """Set more of the page's environment (e.g. a topics folder), undone at its end."""
        for name, value in names.items():
            self._saved_env.setdefault(name, os.environ.get(name))
            os.environ[name] = self.env[name] = value

    # -- what a page's hidden blocks call -------------------------------------------------

    def settings(self) -> Settings:
        """The settings the page's environment gives (what `App()` reads)."""
        return Settings()

    async def migrate(self, *ddl: str) -> None:
        """`stream-jobs db migrate` in the page's schema, then the page's own DDL there."""
        await prepare_schema(self.settings(), list(ddl))

    async def declare(self, topics_dir: str | Path | None = None) -> None:
        """`stream-jobs topics apply` for the types of `topics_dir` (default: the page's
        `STREAM_JOBS_TOPICS_DIR`), which then becomes the page's topics folder."""
        if topics_dir is not None:
            folder = Path(topics_dir)
            self.use_env(STREAM_JOBS_TOPICS_DIR=str(folder if folder.is_absolute()
                                                    else REPO / folder))
        settings = self.settings()
        await apply(settings, load_job_types(settings.topics_dir))

    async def drain(self, app: App, types: Iterable[str] | None = None) -> Counter[str]:
        """Run `app`'s workers (every type with a handler, or `types`) with the outbox relay,
        as `stream-jobs worker APP --until-idle` does, and return the outcomes counted."""
        app.use_settings(self.settings())
        chosen = sorted(types if types is not None else app.handlers)
        workers = [app.worker(job_type) for job_type in chosen]
        host = WorkerHost(workers, until_idle=True,
                          services=process_services(app.settings, workers))
        await host.run()
        return count_outcomes(host.counts())


async def drop_topics(settings: Settings) -> None:
    """Delete the page's topics: every page applies a folder of types, and a broker that
    keeps every run's topics runs out of heap (the development broker did, at ~4,600)."""
    async with admin_client(settings) as admin:
        mine = [name for name in await admin.list_topics()
                if name.startswith(f"{settings.topic_prefix}.")]
        if mine:
            await admin.delete_topics(mine)


def count_outcomes(counts: Mapping[str, Mapping[str, int]]) -> Counter[str]:
    """Every type's outcome counts added up."""
    total: Counter[str] = Counter()
    for found in counts.values():
        total.update(found)
    return total
