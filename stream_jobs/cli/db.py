"""`stream-jobs db migrate` and `stream-jobs db prune`: the database's schema, and old rows.

`db migrate` creates the schema STREAM_JOBS_DATABASE_SCHEMA names if it is missing, then
in it every table and sequence of `stream_jobs.postgres.schema` that is missing.

`db prune --older-than 7d` deletes old dedup rows, in batches; with them kept results
past their `keep_result` and batches and chains finished before the cutoff.

A dedup row protects its job from running twice only while Kafka can still deliver the
job again (a redelivery, a replay, an offsets reset), that is for the lanes' retention.
Rows older than that protect nothing, so the command refuses a cutoff inside the longest
lane retention of the declared types unless `--force`.

The fencing tokens (`ctx.fencing_token`) come from one sequence, a single number with no
row per job, so there is nothing of theirs to prune. Cancels, superseded markers, unique
keys given back, debounce windows that ended before the same cutoff and attempts released
early by `retry-now` before it go with the dedup rows (a cancel's marker is a dedup row).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from typer.core import TyperCommand

from stream_jobs.cancels.store import CancelStore
from stream_jobs.cli.common import settings_of
from stream_jobs.dedup.store import DedupStore
from stream_jobs.durations import format_duration, parse_duration
from stream_jobs.errors import ConfigError
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.plurals import counted
from stream_jobs.postgres.migrate import Migration, migrate
from stream_jobs.results.store import prune_results
from stream_jobs.retry_now.store import ReleaseStore
from stream_jobs.settings import Settings
from stream_jobs.workflows.progress import prune_finished

console = Console(stderr=True)
db_app = typer.Typer(help="The database: create its schema and tables, prune old rows.",
                     no_args_is_help=True)


class _MigrateCommand(TyperCommand):
    """`db migrate`, whose help ends with the tables and sequence it creates, read from
    `stream_jobs.postgres.schema` when the help is shown (so that starting the CLI does not
    import SQLAlchemy, and the list cannot drift from what is created)."""

    @property
    def help(self) -> str:
        from stream_jobs.postgres.schema import SCHEMA_OBJECTS

        return f"{self._help}\n\nIt creates {', '.join(SCHEMA_OBJECTS)}."

    @help.setter
    def help(self, value: str | None) -> None:
        self._help = value or ""


@db_app.command("migrate", cls=_MigrateCommand)
def migrate_command(ctx: typer.Context) -> None:
    """Create the schema STREAM_JOBS_DATABASE_SCHEMA names if it is missing, then in it
    every table and sequence stream-jobs uses that is missing; safe to re-run.

    The user of STREAM_JOBS_DATABASE_URL needs the privilege to create them; without it
    the command says which statement its owner can run instead.
    """
    settings = settings_of(ctx)
    console.print(migrated(asyncio.run(migrate(settings))), highlight=False, soft_wrap=True)


def migrated(done: Migration) -> str:
    """One line for what a migration did."""
    if done.schema_created:
        return f"created schema {done.schema} and in it {', '.join(done.created)}"
    if not done.created:
        return (f"schema {done.schema} is up to date ("
                f"{counted(len(done.present), 'table or sequence', 'tables and sequences')})")
    return (f"schema {done.schema}: created {', '.join(done.created)}; "
            f"{counted(len(done.present), 'other was', 'others were')} there already")


def _spelled(seconds: float) -> str:
    """Whole days as days ("7d", as topics/*.toml write them), else the usual spelling."""
    days = seconds / 86_400
    return f"{days:g}d" if days >= 1 and days == int(days) else format_duration(seconds)


def longest_retention(types: Mapping[str, JobTypePolicy]) -> tuple[float, str] | None:
    """The longest lane retention of the declared types, and the type that has it."""
    if not types:
        return None
    policy = max(types.values(), key=lambda p: p.retention_s)
    return policy.retention_s, policy.job_type


@db_app.command("prune")
def prune(
    ctx: typer.Context,
    older_than: str = typer.Option(..., "--older-than", metavar="DURATION",
                                   help="Delete rows finished longer ago than this (e.g. 7d)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count the rows; delete nothing."),
    batch: int = typer.Option(10_000, "--batch", min=1, help="Rows per DELETE transaction."),
    force: bool = typer.Option(False, "--force", help="Prune inside the lanes' retention."),
) -> None:
    """Delete dedup rows by finished_at, oldest first, a batch per transaction.

    Safe to interrupt and run again. Prune only past the lanes' retention: a job whose
    row is gone runs again if Kafka delivers it again.
    """
    settings = settings_of(ctx)
    older_than_s = parse_duration(older_than)
    _outside_retention(settings, older_than, older_than_s, force=force)
    when, total, deleted, others, results, workflows = asyncio.run(
        _prune(settings, older_than_s, batch=batch, dry_run=dry_run))
    where = f"in schema {settings.database_schema}"
    if dry_run:
        console.print(f"would delete {counted(total, 'dedup row')} finished before {when} {where} "
                      "(dry run: nothing deleted)")
    else:
        console.print(f"deleted {counted(deleted, 'dedup row')} finished before {when} {where}"
                      + (f", and {counted(others, 'row')} of cancels, unique keys, "
                         "debounce windows and early releases" if others else ""))
    verb = "would delete" if dry_run else "deleted"
    console.print(f"{verb} {counted(results, 'kept result')} past their keep_result and "
                  f"{counted(workflows, 'batch or chain', 'batches and chains')} finished before "
                  f"{when}")


def _outside_retention(settings: Settings, older_than: str, older_than_s: float, *,
                       force: bool) -> None:
    """`ConfigError` when `--older-than` is inside a lane's retention (unless forced)."""
    try:
        floor = longest_retention(load_job_types(settings.topics_dir))
    except ConfigError:
        floor = None
        console.print(f"[dim]no job types in {settings.topics_dir}: the retention check is "
                      "skipped[/]")
    if floor is not None and older_than_s < floor[0] and not force:
        raise ConfigError(
            f"--older-than {older_than} is inside the {_spelled(floor[0])} retention "
            f"of {floor[1]!r}: those jobs can still be delivered again (a replay, an offsets "
            f"reset) and would run twice without their rows. Use --older-than "
            f"{_spelled(floor[0])} or more, or --force.")


async def _prune(settings: Settings, older_than_s: float, *, batch: int, dry_run: bool
                 ) -> tuple[str, int, int, int, int, int]:
    """Prune (or count): the cutoff, dedup rows matched and deleted, rows of cancels and
    keys, kept results and workflows."""
    store = DedupStore(settings)
    cancels = CancelStore(settings)
    released = ReleaseStore(settings)
    others = 0
    progress = Progress(TextColumn("prune"), BarColumn(), MofNCompleteColumn(),
                        console=console, transient=True)
    task = progress.add_task("prune", total=None)

    def deleted_so_far(done: int, total: int) -> None:
        # Started at the first batch: a bar stopped before it prints an empty line.
        if not progress.live.is_started:
            progress.start()
        progress.update(task, completed=done, total=total)

    try:
        try:
            cutoff, matched, deleted = await store.prune(
                older_than_s, batch=batch, dry_run=dry_run, progress=deleted_so_far)
        finally:
            if progress.live.is_started:
                progress.stop()
        results = await prune_results(store, batch=batch, dry_run=dry_run)
        workflows = await prune_finished(settings, older_than_s, batch=batch,
                                         dry_run=dry_run)
        if not dry_run:
            try:
                others = await cancels.prune(cutoff)
            except ConfigError as exc:  # a schema migrated before cancels existed
                console.print(f"[dim]cancels and unique keys not pruned: {exc}[/]")
            try:
                others += await released.prune(cutoff)
            except ConfigError as exc:  # a schema migrated before retry-now existed
                console.print(f"[dim]early releases (retry-now) not pruned: {exc}[/]")
    finally:
        await store.close()
        await cancels.close()
        await released.close()
    return (cutoff.isoformat(timespec="seconds"), matched, deleted, others, results,
            workflows)
