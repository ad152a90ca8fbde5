"""Fixtures for job-path tests: declare a type (TOML + topics apply) and build an App."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest

from stream_jobs.app import App
from stream_jobs.dedup.store import DedupStore
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.settings import Settings

Declare = Callable[..., Awaitable[JobTypePolicy]]


@pytest.fixture
def declare(settings: Settings) -> Declare:
    """Write topics/<type>.toml with the given keys and make Kafka match it."""

    async def declare_type(job_type: str, **keys: object) -> JobTypePolicy:
        # JSON spells strings, numbers and lists of them as TOML does.
        lines = [f"{name} = {json.dumps(value)}" for name, value in keys.items()]
        (settings.topics_dir / f"{job_type}.toml").write_text("\n".join(lines) + "\n")
        types = load_job_types(settings.topics_dir)
        await apply(settings, types)
        return types[job_type]

    return declare_type


@pytest.fixture
async def app(settings: Settings, schema: str) -> App:
    """An App on this test's topics and schema, with the dedup table migrated."""
    store = DedupStore(settings)
    try:
        await store.migrate()
    finally:
        await store.close()
    return App(settings)
