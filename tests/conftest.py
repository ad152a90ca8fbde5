"""Fixtures shared by every tier. Unit tests use none of the services.

Integration tests get the real stack once per run from the plugin our users test with
(`stream_jobs.testing.plugin`): the one named by `STREAM_JOBS_KAFKA_BOOTSTRAP` and
`STREAM_JOBS_DATABASE_URL` when both are set, else the local stack that `stream-jobs dev
up` starts (idempotent, so `make test` and a bare `pytest` agree), or Docker containers
with `STREAM_JOBS_TEST_BACKEND=testcontainers`. A contradictory environment (only one of
the two set, an unknown backend) stops the run before any test. Each test gets a fresh
topic prefix, so fresh topics and consumer groups, and a fresh Postgres schema: the
fixtures below are the plugin's under the short names our tests use.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stream_jobs.errors import ConfigError
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import TestStack, choose_backend

Stack = TestStack


def pytest_configure(config: pytest.Config) -> None:
    try:
        choose_backend(os.environ)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack(stream_jobs_stack: TestStack) -> TestStack:
    return stream_jobs_stack


@pytest.fixture
def prefix(stream_jobs_prefix: str) -> str:
    """A topic prefix no other test uses: fresh topics, consumer groups and schema."""
    return stream_jobs_prefix


@pytest.fixture
def settings(stream_jobs_settings: Settings) -> Settings:
    return stream_jobs_settings


@pytest.fixture
def schema(stream_jobs_schema: str) -> str:
    """A fresh Postgres schema for this test (the settings point at it), dropped afterwards."""
    return stream_jobs_schema
