"""The environment a `stream-jobs` subprocess needs to act on this test's topics and schema."""

from __future__ import annotations

import os

from stream_jobs.settings import Settings


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment plus the settings a test's CLI call must share with it."""
    return {**os.environ,
            "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "STREAM_JOBS_DATABASE_URL": settings.database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": settings.database_schema,
            "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
            "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir),
            **extra}
