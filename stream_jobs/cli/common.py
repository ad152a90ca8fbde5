"""The root `stream-jobs` app and the options every command shares (each is also an env var)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import typer
from typer.models import ParameterInfo

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


def flowing(text: str) -> str:
    """`text` as sentences: each paragraph on one line (the renderer wraps it to the
    terminal), blank lines between paragraphs kept; a paragraph that starts with \\b (click's
    "keep my line breaks") and anything after \\f (not shown) are left as written."""
    shown, cut, hidden = inspect.cleandoc(text).partition("\f")
    paragraphs = [part if part.startswith("\b")
                  else " ".join(line.strip() for line in part.strip().splitlines())
                  for part in shown.split("\n\n")]
    return "\n\n".join(paragraphs) + cut + hidden


def flow_help(typer_app: typer.Typer) -> None:
    """Make every help text of `typer_app`'s command tree read as sentences.

    typer keeps a docstring's own line breaks in what `--help` shows (beyond a command's
    first paragraph), so a help text wrapped at 90 columns in the source broke mid-sentence
    in a terminal. Called once, after every command is registered; running it again
    changes nothing."""
    if isinstance(typer_app.info.help, str):
        typer_app.info.help = flowing(typer_app.info.help)
    if typer_app.registered_callback is not None:
        _flow_callback(typer_app.registered_callback.callback)
    for command in typer_app.registered_commands:
        if isinstance(command.help, str):
            command.help = flowing(command.help)
        _flow_callback(command.callback)
    for group in typer_app.registered_groups:
        if isinstance(group.help, str):
            group.help = flowing(group.help)
        _flow_callback(group.callback)
        if group.typer_instance is not None:
            flow_help(group.typer_instance)


def _flow_callback(callback: Callable[..., Any] | object) -> None:
    """The docstring of a command's function and the help of its arguments and options."""
    if not inspect.isfunction(callback):  # none, or typer's placeholder for none
        return
    if callback.__doc__:
        callback.__doc__ = flowing(callback.__doc__)
    for parameter in inspect.signature(callback).parameters.values():
        info = parameter.default
        if isinstance(info, ParameterInfo) and isinstance(info.help, str):
            info.help = flowing(info.help)
