"""pytest fixtures for handler tests (registered as a pytest plugin on install).

`job_tester` runs an app's handlers in memory: `t = job_tester(app)` is a `JobTester`
(`stream_jobs.testing.tester`), open for the test and closed after it.

The rest put handlers on a real Kafka and Postgres. `stream_jobs_stack` is the run's
stack, from the backend `STREAM_JOBS_TEST_BACKEND` chooses (`stream_jobs.testing.stack`).
Per test, the other fixtures give a corner of it of the test's own:

- `stream_jobs_prefix`: a topic prefix no other test uses (also the schema's name);
- `stream_jobs_settings`: `Settings` on the stack with that prefix, that schema and a
  topics folder in the test's tmp_path;
- `stream_jobs_schema`: that Postgres schema, created for the test and dropped after it;
- `stream_jobs_declare`: `await declare("email.send", partitions=2, retry_tiers=["1s"])`
  writes `topics/email.send.toml` and makes Kafka match it;
- `stream_jobs_app`: an empty `App` on those settings, the dedup table made;
- `stream_jobs_bind`: `bind(app, *ddl)` puts your own `App` on those settings for the
  test (its settings come back afterwards), runs your DDL in the schema and makes the
  dedup table.

The fixtures are synchronous (database set-up runs on a thread of its own), so they work
under pytest-asyncio, anyio or plain pytest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from stream_jobs.app import App
from stream_jobs.errors import StreamJobsError
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import (
    Declare,
    TestStack,
    choose_backend,
    create_schema,
    declare_type,
    drop_schema,
    external_stack,
    fresh_prefix,
    local_stack,
    run_async,
    settings_for,
)
from stream_jobs.testing.tester import JobTester

Bind = Callable[..., App]
StartTester = Callable[..., JobTester]
T = TypeVar("T")


@pytest.fixture
def job_tester() -> Iterator[StartTester]:
    """`t = job_tester(app, **options)`: a `JobTester` on `app` (options as its own: types,
    database_url, start, timeout_s), open until the test ends. In memory: no services."""
    opened: list[JobTester] = []

    def start(app: App, **options: Any) -> JobTester:
        tester = JobTester(app, **options).open()
        opened.append(tester)
        return tester

    yield start
    for tester in reversed(opened):
        tester.close()


@pytest.fixture(scope="session")
def stream_jobs_stack() -> Iterator[TestStack]:
    """The test run's Kafka and Postgres (local, testcontainers or external)."""
    backend = _or_fail(lambda: choose_backend(os.environ))
    if backend == "testcontainers":
        yield from _containers()
    elif backend == "external":
        yield _or_fail(lambda: external_stack(os.environ))
    else:
        yield _or_fail(local_stack)


def _or_fail(make: Callable[[], T]) -> T:
    """`make()`; a StreamJobsError fails the test with its sentence, without a traceback."""
    try:
        return make()
    except StreamJobsError as exc:
        failure = str(exc)
    pytest.fail(failure, pytrace=False)


def _containers() -> Iterator[TestStack]:
    from stream_jobs.testing.containers import containers_stack, docker_unavailable, images_from

    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)
    try:
        with containers_stack(images_from(os.environ)) as stack:
            yield stack
            return
    except StreamJobsError as exc:
        failure = str(exc)
    pytest.fail(failure, pytrace=False)


@pytest.fixture
def stream_jobs_prefix() -> str:
    """A topic prefix (and schema name) no other test uses."""
    return fresh_prefix()


@pytest.fixture
def stream_jobs_settings(stream_jobs_stack: TestStack, stream_jobs_prefix: str,
                         tmp_path: Path) -> Settings:
    """Settings on the stack, with this test's prefix, schema and topics folder."""
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir(exist_ok=True)
    return settings_for(stream_jobs_stack, stream_jobs_prefix, topics_dir)


@pytest.fixture
def stream_jobs_schema(stream_jobs_settings: Settings) -> Iterator[str]:
    """This test's Postgres schema (the settings point at it), dropped afterwards."""
    run_async(lambda: create_schema(stream_jobs_settings))
    try:
        yield stream_jobs_settings.database_schema
    finally:
        run_async(lambda: drop_schema(stream_jobs_settings))


@pytest.fixture
def stream_jobs_declare(stream_jobs_settings: Settings) -> Declare:
    """`await declare(job_type, **toml_keys)`: write topics/<type>.toml, make Kafka match."""

    async def declare(job_type: str, **keys: object) -> JobTypePolicy:
        return await declare_type(stream_jobs_settings, job_type, **keys)

    return declare


@pytest.fixture
def stream_jobs_app(stream_jobs_settings: Settings, stream_jobs_schema: str) -> App:
    """An App (no handlers yet) on this test's topics and schema, the dedup table made."""
    run_async(lambda: prepare_schema(stream_jobs_settings))
    return App(stream_jobs_settings)


@pytest.fixture
def stream_jobs_bind(stream_jobs_settings: Settings,
                     stream_jobs_schema: str) -> Iterator[Bind]:
    """`bind(app, *ddl)`: your App on this test's topics and schema until the test ends."""
    bound: list[tuple[App, Settings]] = []

    def bind(app: App, *ddl: str) -> App:
        run_async(lambda: prepare_schema(stream_jobs_settings, ddl))
        bound.append((app, app.settings))
        app.use_settings(stream_jobs_settings)
        return app

    yield bind
    for app, before in reversed(bound):
        app.use_settings(before)
