"""The root `stream-jobs` app and the options every command shares (each is also an env var)."""

from __future__ import annotations

from collections.abc import Coroutine
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import typer

from stream_jobs.settings import Settings, load_settings

T = TypeVar("T")

app = typer.Typer(
    name="stream-jobs",
    help="A Kafka-only job system: enqueue, run workers, replay, drain the DLQ, watch stats.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    kafka_bootstrap: str | None = typer.Option(
        None, envvar="STREAM_JOBS_KAFKA_BOOTSTRAP", help="Kafka bootstrap servers, host:port,..."
    ),
    database_url: str | None = typer.Option(
        None, envvar="STREAM_JOBS_DATABASE_URL", help="Postgres URL for the dedup table."
    ),
    topic_prefix: str | None = typer.Option(
        None, envvar="STREAM_JOBS_TOPIC_PREFIX", help="Prefix of every topic and group name."
    ),
    topics_dir: Path | None = typer.Option(
        None, envvar="STREAM_JOBS_TOPICS_DIR", help="Folder of topics/<type>.toml files."
    ),
) -> None:
    ctx.obj = {
        "kafka_bootstrap": kafka_bootstrap,
        "database_url": database_url,
        "topic_prefix": topic_prefix,
        "topics_dir": topics_dir,
    }


def settings_of(ctx: typer.Context, **extra: object) -> Settings:
    """The settings for this command: environment, then root options, then `extra`."""
    given = dict(ctx.find_root().obj or {})
    given.update(extra)
    return load_settings(**given)


def run_fast(main: Coroutine[Any, Any, T]) -> T:
    """Run a long-lived coroutine (worker, demo) on uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:  # not on this platform: the standard loop works, only slower
        import asyncio

        return asyncio.run(main)
    return uvloop.run(main)


class LogLevel(StrEnum):
    """The choices of `--log-level` and `--kafka-log-level`: logging's level names."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


# The logging options of every long-running command (worker, outbox relay, scheduler),
# defined once so their names, variables and help never drift apart.
LOG_LEVEL_OPTION: Any = typer.Option(
    LogLevel.INFO, "--log-level", envvar="STREAM_JOBS_LOG_LEVEL", case_sensitive=False,
    help="Log lines from this level up (any case).")
KAFKA_LOG_LEVEL_OPTION: Any = typer.Option(
    None, "--kafka-log-level", envvar="STREAM_JOBS_KAFKA_LOG_LEVEL", case_sensitive=False,
    help="The Kafka driver's (aiokafka's) log lines from this level or --log-level up, "
    "whichever is higher (any case); WARNING by default, as its INFO lines repeat the "
    "partitions at every rebalance.")
LOG_FORMAT_OPTION: Any = typer.Option(
    None, "--log-format", envvar="STREAM_JOBS_LOG_FORMAT", metavar="text|json",
    help="text (fields as key=value after the message) or json (one object a line).")
