"""`stream-jobs topics plan|apply|list [DIR]`: make Kafka match topics/*.toml, and show it."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from stream_jobs.cli.common import settings_of
from stream_jobs.cli.tables import (
    WIDE_OPTION,
    FittedTable,
    number_column,
    print_table,
    text_column,
)
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka import topics as kafka_topics
from stream_jobs.plurals import counted
from stream_jobs.settings import Settings
from stream_jobs.topic_plan import Change

topics_app = typer.Typer(help="Declare job types in topics/*.toml; plan, apply and list their "
                              "Kafka topics.", no_args_is_help=True)
console = Console()

_DIR = typer.Argument(None, show_default=False,
                      help="Folder of <type>.toml files [default: STREAM_JOBS_TOPICS_DIR "
                           "or topics/].")
_STYLE = {"create": "green", "add-partitions": "yellow", "set-config": "yellow",
          "warn": "magenta", "ok": "dim"}


@topics_app.command("plan")
def plan(ctx: typer.Context, directory: Path | None = _DIR) -> None:
    """Show what `apply` would change. Changes nothing."""
    settings, types = _load(ctx, directory)
    changes = asyncio.run(kafka_topics.plan(settings, types))
    _print_changes(changes, f"plan for {settings.topics_dir} on {settings.kafka_bootstrap}")
    pending = [c for c in changes if c.action not in ("ok", "warn")]
    if pending:
        console.print(f"{_summary(changes)}. Run `stream-jobs topics apply` to make them.")
    else:
        console.print("Kafka matches topics/: nothing to do.")


@topics_app.command("apply")
def apply(ctx: typer.Context, directory: Path | None = _DIR) -> None:
    """Create missing topics, add partitions and set configs. Never deletes anything."""
    settings, types = _load(ctx, directory)
    with console.status(f"applying {settings.topics_dir} to {settings.kafka_bootstrap}"):
        changes = asyncio.run(kafka_topics.apply(settings, types))
    _print_changes(changes, f"applied {settings.topics_dir} to {settings.kafka_bootstrap}")
    console.print(f"{_summary(changes)}.")


@topics_app.command("list")
def list_(ctx: typer.Context, directory: Path | None = _DIR, wide: bool = WIDE_OPTION) -> None:
    """Every declared topic with its partitions and record counts, and topics under the
    prefix that no file declares any more (kept: nothing is ever deleted)."""
    settings, types = _load(ctx, directory)
    rows = asyncio.run(kafka_topics.list_topics(settings, types))
    print_table(console, topics_table(rows, f"topics under {settings.topic_prefix!r} on "
                                          f"{settings.kafka_bootstrap}", wide=wide), wide=wide)
    missing = sum(1 for row in rows if not row.exists)
    if missing:
        console.print(f"{missing} topic{'s' if missing != 1 else ''} missing: run "
                      "`stream-jobs topics apply`.")


# At 80 columns each topic, its role, whether it exists and the records it holds; --wide
# adds its partitions and the records ever written.
_TOPIC_COLUMNS = (text_column("topic"), text_column("role"), text_column("exists"),
                  number_column("partitions", wide=True), number_column("messages"),
                  number_column("written", wide=True))


def topics_table(rows: list[kafka_topics.TopicRow], title: str, *, wide: bool
                 ) -> FittedTable:
    table = FittedTable(_TOPIC_COLUMNS, wide=wide, title=title)
    for row in rows:
        role = row.role if row.role in ("dlq", "overflow") else f"{row.role} {row.name}"
        table.add_row(
            row.topic if row.declared else f"{row.topic} [dim](undeclared)[/]", role,
            "[green]yes[/]" if row.exists else "[red]missing[/]",
            str(row.partitions), _count(row.messages), _count(row.end_offset_sum),
        )
    return table


def _load(ctx: typer.Context, directory: Path | None) -> tuple[Settings, dict[str, JobTypePolicy]]:
    # Passing None would hide a --topics-dir given to the root command.
    settings = settings_of(ctx) if directory is None else settings_of(ctx, topics_dir=directory)
    return settings, load_job_types(settings.topics_dir)


def _print_changes(changes: list[Change], title: str) -> None:
    console.print(changes_table(changes, title))


def changes_table(changes: list[Change], title: str) -> Table:
    table = Table(title=title)
    table.add_column("action", no_wrap=True)
    table.add_column("topic", overflow="fold")
    table.add_column("detail", overflow="fold")
    for change in changes:
        style = _STYLE[change.action]
        table.add_row(f"[{style}]{change.action}[/]", change.topic, change.detail)
    return table


def _summary(changes: list[Change]) -> str:
    counts = Counter(c.action for c in changes)
    topics = len({c.topic for c in changes})
    parts = [f"{counts[a]} {a}" for a in ("create", "add-partitions", "set-config", "warn")
             if counts[a]]
    return f"{counted(topics, 'topic')}: " + (", ".join(parts) if parts else "all ok")


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"
