"""Fixtures shared by every tier. Unit tests use none of the services.

Integration tests get the real stack once per run: the one named by
`STREAM_JOBS_KAFKA_BOOTSTRAP` and `STREAM_JOBS_DATABASE_URL` when both are set, else the
local stack that `stream-jobs dev up` starts (idempotent, so `make test` and a bare
`pytest` agree). Only one of the two set stops the run before any test, since the other
service would quietly come from the local stack. Each test gets a fresh topic prefix, so
fresh topics and consumer groups, and a fresh Postgres schema.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stream_jobs.settings import Settings


@dataclass(frozen=True)
class Stack:
    kafka_bootstrap: str
    database_url: str


OVERRIDE = ("STREAM_JOBS_KAFKA_BOOTSTRAP", "STREAM_JOBS_DATABASE_URL")


def pytest_configure(config: pytest.Config) -> None:
    given = [name for name in OVERRIDE if os.environ.get(name)]
    if len(given) == 1:
        [missing] = set(OVERRIDE) - set(given)
        raise pytest.UsageError(
            f"{given[0]} is set but {missing} is not: set both to test against your own "
            "services, or neither to test against the local stack (stream-jobs dev up)."
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack() -> Stack:
    bootstrap, dsn = (os.environ.get(name) for name in OVERRIDE)
    if bootstrap and dsn:
        return Stack(bootstrap, dsn)
    from stream_jobs.stack import KafkaCluster, PostgresServer

    base = Settings()
    kafka = KafkaCluster(base, 1)
    kafka.up()
    server = PostgresServer(base)
    server.up()
    return Stack(kafka.bootstrap, server.dsn)


@pytest.fixture
def prefix() -> str:
    """A topic prefix no other test uses: fresh topics, consumer groups and schema."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings(stack: Stack, prefix: str, tmp_path: Path) -> Settings:
    topics_dir = tmp_path / "topics"
    topics_dir.mkdir()
    return Settings(
        kafka_bootstrap=stack.kafka_bootstrap,
        database_url=stack.database_url,
        database_schema=prefix,
        topic_prefix=prefix,
        topics_dir=topics_dir,
    )


@pytest.fixture
async def schema(settings: Settings) -> AsyncIterator[str]:
    """A fresh Postgres schema for this test (the settings point at it), dropped afterwards."""
    import asyncpg

    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'CREATE SCHEMA "{settings.database_schema}"')
        yield settings.database_schema
        await conn.execute(f'DROP SCHEMA "{settings.database_schema}" CASCADE')
    finally:
        await conn.close()
