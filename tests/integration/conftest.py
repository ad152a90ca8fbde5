"""Fixtures for job-path tests: declare a type (TOML + topics apply) and build an App.

Both are the plugin's (`stream_jobs.testing.plugin`), under the names our tests use.
"""

from __future__ import annotations

import pytest

from stream_jobs.app import App
from stream_jobs.testing.stack import Declare
from tests.traced import exported, untraced  # noqa: F401 - the tracing tests' fixtures

__all__ = ["Declare"]


@pytest.fixture
def declare(stream_jobs_declare: Declare) -> Declare:
    """Write topics/<type>.toml with the given keys and make Kafka match it."""
    return stream_jobs_declare


@pytest.fixture
def app(stream_jobs_app: App) -> App:
    """An App on this test's topics and schema, with the dedup table migrated."""
    return stream_jobs_app
