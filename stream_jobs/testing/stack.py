"""A real Kafka and Postgres for tests, and a fresh corner of them for each test.

Which stack a test run gets is `STREAM_JOBS_TEST_BACKEND`:

- `local`: the stack `stream-jobs dev up` runs (Kafka from Maven's jars, Debian's
  Postgres), started if it is not running; needs the project's checkout (`ops/`).
- `testcontainers`: Kafka (KRaft) and Postgres in Docker containers for the run
  (`stream_jobs.testing.containers`), images from `STREAM_JOBS_TEST_KAFKA_IMAGE` and
  `STREAM_JOBS_TEST_POSTGRES_IMAGE`.
- `external`: the services `STREAM_JOBS_KAFKA_BOOTSTRAP` and `STREAM_JOBS_DATABASE_URL`
  name.

Unset, it is `external` when both of those are set and `local` otherwise. Each test then
gets its own topic prefix (so its own topics and consumer groups) and a Postgres schema of
the same name, dropped afterwards: tests share a cluster without seeing each other's jobs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from stream_jobs.errors import ConfigError
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.postgres.pool import connect
from stream_jobs.settings import Settings

BACKEND_ENV = "STREAM_JOBS_TEST_BACKEND"
KAFKA_ENV = "STREAM_JOBS_KAFKA_BOOTSTRAP"
DATABASE_ENV = "STREAM_JOBS_DATABASE_URL"
Backend = Literal["local", "testcontainers", "external"]
BACKENDS: tuple[Backend, ...] = ("local", "testcontainers", "external")

T = TypeVar("T")
Declare = Callable[..., Awaitable[JobTypePolicy]]


@dataclass(frozen=True)
class TestStack:
    """Where a test run's Kafka and Postgres answer, and which backend provided them."""

    __test__ = False  # not a test class, whatever pytest's name rules say

    kafka_bootstrap: str
    database_url: str
    backend: Backend


def choose_backend(environ: Mapping[str, str]) -> Backend:
    """The backend the environment asks for; a contradiction raises `ConfigError`."""
    named = environ.get(BACKEND_ENV, "").strip().lower()
    if named and named not in BACKENDS:
        raise ConfigError(f"{BACKEND_ENV}={named!r} is not a test backend: choose "
                          "local, testcontainers or external.")
    given = [name for name in (KAFKA_ENV, DATABASE_ENV) if environ.get(name)]
    if named in ("", "external") and len(given) == 1:
        [missing] = {KAFKA_ENV, DATABASE_ENV} - set(given)
        raise ConfigError(f"{given[0]} is set but {missing} is not: set both to test against "
                          "your own services, or neither to test against the local stack "
                          "(stream-jobs dev up).")
    if named == "external" and not given:
        raise ConfigError(f"{BACKEND_ENV}=external tests against the services {KAFKA_ENV} and "
                          f"{DATABASE_ENV} name: set both.")
    for backend in BACKENDS:
        if named == backend:
            return backend
    return "external" if given else "local"


def external_stack(environ: Mapping[str, str]) -> TestStack:
    """The services the environment names (`choose_backend` has checked both are set)."""
    return TestStack(environ[KAFKA_ENV], environ[DATABASE_ENV], "external")


def local_stack(settings: Settings | None = None) -> TestStack:
    """The local stack of `stream-jobs dev up`, started when it is not running."""
    from stream_jobs.stack import KafkaCluster, PostgresServer

    base = settings or Settings()
    kafka = KafkaCluster(base, 1)
    kafka.up()
    server = PostgresServer(base)
    server.up()
    return TestStack(kafka.bootstrap, server.dsn, "local")


def fresh_prefix() -> str:
    """A topic prefix (and schema name) no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


def settings_for(stack: TestStack, prefix: str, topics_dir: Path) -> Settings:
    """Settings on `stack` whose topics, groups and schema are the test's own."""
    return Settings(
        kafka_bootstrap=stack.kafka_bootstrap,
        database_url=stack.database_url,
        database_schema=prefix,
        topic_prefix=prefix,
        topics_dir=topics_dir,
    )


def toml_value(value: object) -> str:
    """A TOML value: a string, bool, int, float, or a list or table of them."""
    if isinstance(value, str):
        # TOML takes every character raw but quotes, backslashes and control characters;
        # JSON's \ud83d\ude00 pairs for characters past U+FFFF are not TOML.
        escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F
                          else "\\" + c if c in '"\\' else c for c in value)
        return f'"{escaped}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):  # an inline table ([fairness], lane_weights)
        return "{" + ", ".join(f"{toml_value(str(k))} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise ConfigError(f"{value!r} cannot be written to a topics/*.toml file: use strings, "
                      "numbers, booleans or lists of them.")


def toml_lines(keys: Mapping[str, object]) -> str:
    """`topics/T.toml` text for `keys`."""
    return "".join(f"{name} = {toml_value(value)}\n" for name, value in keys.items())


async def declare_type(settings: Settings, job_type: str, **keys: object) -> JobTypePolicy:
    """Write `topics/<job_type>.toml` in the settings' topics folder with `keys` and make
    Kafka match it (`stream-jobs topics apply`); the type's policy as workers read it."""
    (settings.topics_dir / f"{job_type}.toml").write_text(toml_lines(keys))
    types = load_job_types(settings.topics_dir)
    await apply(settings, types)
    return types[job_type]


async def create_schema(settings: Settings) -> None:
    conn = await connect(settings, in_schema=False)
    try:
        await conn.execute(f'CREATE SCHEMA "{settings.database_schema}"')
    finally:
        await conn.close()


async def drop_schema(settings: Settings) -> None:
    conn = await connect(settings, in_schema=False)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{settings.database_schema}" CASCADE')
    finally:
        await conn.close()


def run_async(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end from synchronous code, on a thread of its own.

    Fixtures use this so they work with any async test runner (or none): the coroutine
    gets a loop of its own and never touches the loop the tests run on.
    """
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(make()))
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=target, name="stream-jobs-fixture")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


__all__ = [
    "BACKENDS",
    "Backend",
    "Declare",
    "TestStack",
    "choose_backend",
    "create_schema",
    "declare_type",
    "drop_schema",
    "external_stack",
    "fresh_prefix",
    "local_stack",
    "run_async",
    "settings_for",
    "toml_lines",
]
