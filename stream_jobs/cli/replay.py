"""`stream-jobs replay TOPIC ...` and `stream-jobs offsets reset GROUP ...`.

Both print what they will do before doing it; replay then shows progress and a summary.
"""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from stream_jobs import clock
from stream_jobs.cli.common import settings_of
from stream_jobs.durations import parse_rate
from stream_jobs.plurals import counted
from stream_jobs.tools.group_offsets import OffsetChange, reset_offsets
from stream_jobs.tools.replay import ReplayResult, parse_time_ms, replay, resume_hint

offsets_app = typer.Typer(help="Move a consumer group's committed offsets.",
                          no_args_is_help=True)
console = Console()
_LISTED_SKIPS = 20
_TIME_HELP = "ISO 8601 (no zone means UTC) or a duration ago, e.g. 2h."


def replay_command(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="A lane, delay tier or DLQ topic of ours."),
    partition: int | None = typer.Option(
        None, "--partition", "-p", help="The partition (needed with offsets) (default: all)."),
    from_offset: int | None = typer.Option(None, "--from-offset", help="First offset."),
    to_offset: int | None = typer.Option(
        None, "--to-offset", help="Last offset, included (default: the end)."),
    from_time: str | None = typer.Option(
        None, "--from-time", help=f"First record time, included: {_TIME_HELP}"),
    to_time: str | None = typer.Option(
        None, "--to-time", help=f"Records before this time: {_TIME_HELP}"),
    to_lane: str | None = typer.Option(
        None, "--to-lane", metavar="TYPE[:priority]",
        help="Write every job to this lane (default: each job's own lane)."),
    rerun: bool = typer.Option(
        False, "--rerun", help="New job IDs (sj-rerun-of = original), so handlers run again."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would be replayed only."),
    rate: str | None = typer.Option(None, "--rate", metavar="N/s", help="At most this rate."),
) -> None:
    """Write the jobs in a range of TOPIC again to their lane, and wait for every ack.

    Without --rerun the job IDs are kept: jobs that already finished through ctx.once()
    are acknowledged without running. The source is never changed, so stopping midway
    loses nothing; the message says where to resume.
    """
    settings = settings_of(ctx)
    now_ms = clock.now_ms()
    from_time_ms = parse_time_ms(from_time, now_ms=now_ms) if from_time is not None else None
    to_time_ms = parse_time_ms(to_time, now_ms=now_ms) if to_time is not None else None
    rate_per_s = parse_rate(rate) if rate is not None else None
    bar = _ReplayBar()
    try:
        result = asyncio.run(replay(
            settings, topic, partition=partition, from_offset=from_offset,
            to_offset=to_offset, from_time_ms=from_time_ms, to_time_ms=to_time_ms,
            to_lane=to_lane, rerun=rerun, dry_run=dry_run, rate_per_s=rate_per_s,
            progress=bar))
    except KeyboardInterrupt:
        bar.stop()
        if bar.result is not None:
            console.print(f"[yellow]interrupted[/] after {bar.result.written:,} of "
                          f"{counted(bar.result.planned, 'record')}. {resume_hint(bar.result)}",
                          highlight=False)
        # SystemExit, not typer.Exit: in the entry point's non-standalone mode typer turns
        # an Exit into a return value, and the exit code would be lost.
        raise SystemExit(130) from None
    finally:
        bar.stop()
    _print_summary(result)


@offsets_app.command("reset")
def reset(
    ctx: typer.Context,
    group: str = typer.Argument(..., help="The consumer group, e.g. jobs.email.send.worker."),
    topic: str | None = typer.Option(
        None, "--topic", help="Only this topic (default: every topic the group reads)."),
    to_offset: int | None = typer.Option(None, "--to-offset", help="This offset."),
    to_time: str | None = typer.Option(
        None, "--to-time", help=f"The first record at or after this time: {_TIME_HELP}"),
    to_earliest: bool = typer.Option(False, "--to-earliest", help="The oldest record kept."),
    to_latest: bool = typer.Option(False, "--to-latest", help="The end: skip the backlog."),
    force: bool = typer.Option(
        False, "--force", help="Skip the check for active members (Kafka still refuses "
                               "a group that has members)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the changes only."),
) -> None:
    """Rewind or forward GROUP's committed offsets. Stop the group's workers first.

    Rewinding delivers jobs again; those that finished through ctx.once() are
    acknowledged without running. Forwarding skips jobs: they never run.
    """
    settings = settings_of(ctx)
    to_time_ms = (parse_time_ms(to_time, now_ms=clock.now_ms())
                  if to_time is not None else None)
    changes = asyncio.run(reset_offsets(
        settings, group, topic=topic, to_offset=to_offset, to_time_ms=to_time_ms,
        to_earliest=to_earliest, to_latest=to_latest, force=force, dry_run=dry_run,
        on_plan=lambda planned: _print_offsets(group, planned, dry_run)))
    if dry_run:
        console.print("dry run: nothing committed.")
    else:
        console.print(f"[green]committed[/] {counted(len(changes), 'offset')} for {group}; "
                      "its workers start there.", highlight=False)


class _ReplayBar:
    """The replay's plan, then a progress bar (a `ReplayProgress`)."""

    def __init__(self) -> None:
        self.result: ReplayResult | None = None
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        self._task: TaskID | None = None
        self._running = False

    def started(self, result: ReplayResult) -> None:
        self.result = result
        _print_plan(result)
        if result.planned:
            self._progress.start()
            self._running = True
            what = "reading (dry run)" if result.dry_run else "replaying"
            self._task = self._progress.add_task(what, total=result.planned)

    def advanced(self, result: ReplayResult) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=result.read)

    def stop(self) -> None:
        self._task = None
        if self._running:  # Progress.stop prints a line even when it never started
            self._running = False
            self._progress.stop()


def plan_table(result: ReplayResult) -> Table:
    table = Table(title=f"replay plan for {result.topic}")
    table.add_column("partition", justify="right")
    table.add_column("offsets", justify="right")
    table.add_column("records", justify="right")
    for part in result.selected:
        span = f"{part.start}-{part.end - 1}" if part.size else "-"
        table.add_row(str(part.partition), span, f"{part.size:,}")
    return table


def written_table(result: ReplayResult) -> Table:
    table = Table(title="dry run: would be written" if result.dry_run else "written")
    for column in ("partition", "type", "to", "records"):
        table.add_column(column, justify="right" if column in ("partition", "records")
                         else "left", overflow="fold")
    for (partition, job_type, destination), count in sorted(result.counts.items()):
        table.add_row(str(partition), job_type, destination, f"{count:,}")
    return table


def skipped_table(result: ReplayResult) -> Table:
    skipped = Table(title=f"{counted(result.skipped_total, 'record')} skipped: not jobs")
    for column in ("partition", "offset", "reason", "detail"):
        skipped.add_column(column, overflow="fold")
    for skip in result.skipped[:_LISTED_SKIPS]:
        skipped.add_row(str(skip.partition), str(skip.offset), skip.reason, skip.message)
    return skipped


def _print_plan(result: ReplayResult) -> None:
    console.print(plan_table(result))
    console.print(f"to: {result.target}. {result.headers_note()}", highlight=False)
    if result.dry_run:
        console.print("dry run: nothing will be written.")
    if not result.planned:
        console.print("The range holds no records: nothing to replay.")


def _print_summary(result: ReplayResult) -> None:
    if not result.planned:
        return
    console.print(written_table(result))
    if result.skipped_total:
        console.print(skipped_table(result))
        if result.skipped_total > _LISTED_SKIPS:
            console.print(f"... and {result.skipped_total - _LISTED_SKIPS:,} more.")
    if result.expired:
        late = counted(result.expired, "of the jobs is", "of the jobs are")
        console.print(f"[yellow]{late} past their expiry[/]: the "
                      "worker counts such jobs expired and does not run them.", highlight=False)
    verb = "would write" if result.dry_run else "wrote"
    console.print(f"{verb} {result.written:,} of {counted(result.read, 'record')} read from "
                  f"{result.topic}; skipped {result.skipped_total:,}.", highlight=False)


def _print_offsets(group: str, changes: list[OffsetChange], dry_run: bool) -> None:
    console.print(offsets_table(group, changes, dry_run))


def offsets_table(group: str, changes: list[OffsetChange], dry_run: bool) -> Table:
    title = f"offsets of {group}" + (" (dry run)" if dry_run else "")
    table = Table(title=title)
    table.add_column("topic", overflow="fold")
    for column in ("partition", "committed", "new", "move"):
        table.add_column(column, justify="right", no_wrap=True)
    for change in changes:
        old = "-" if change.old is None else str(change.old)
        move = ("new" if change.old is None else "same" if change.new == change.old
                else f"{change.new - change.old:+,}")
        table.add_row(change.tp.topic, str(change.tp.partition), old, str(change.new), move)
    return table

