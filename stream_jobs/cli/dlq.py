"""`stream-jobs dlq list|show|requeue|purge TYPE`: look at and act on dead letters.

Each command says what it will do before it changes anything, and is safe to run again:
see `stream_jobs.dlq.requeue` for how a requeue survives being interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from stream_jobs.cli.common import settings_of
from stream_jobs.cli.tables import (
    JOB_ID_WIDTH,
    WIDE_OPTION,
    FittedTable,
    job_id_column,
    number_column,
    print_table,
    text_column,
    word_column,
)
from stream_jobs.clock import now_ms
from stream_jobs.dlq import listing as dlq
from stream_jobs.dlq.letters import DEFAULT_MAX_REQUEUES, LetterRow, Verdict, parse_since
from stream_jobs.dlq.requeue import (
    RequeuePlan,
    RequeueResult,
    SelectAll,
    SelectIds,
    Selection,
    SelectReason,
)
from stream_jobs.dlq.requeue import requeue as requeue_letters
from stream_jobs.durations import parse_rate
from stream_jobs.errors import ConfigError
from stream_jobs.plurals import counted
from stream_jobs.settings import Settings

dlq_app = typer.Typer(help="Dead letters: list, show, requeue and purge a type's DLQ.",
                      no_args_is_help=True)
console = Console()

_TYPE = typer.Argument(..., metavar="TYPE", help="The job type, e.g. email.send.")
_JSON = typer.Option(False, "--json", help="Print JSON instead of tables.")


@dlq_app.command("list")
def list_(
    ctx: typer.Context,
    job_type: str = _TYPE,
    reason: str | None = typer.Option(None, "--reason", help="Only letters with this reason."),
    since: str | None = typer.Option(None, "--since", help="Only letters that failed since: "
                                     "an ISO time (UTC unless it has an offset) or a duration "
                                     "ago such as 1h."),
    limit: int = typer.Option(50, "--limit", min=0, help="Rows to show: the most recent."),
    every_letter: bool = typer.Option(False, "--every-letter", help="One row per letter "
                                      "(default: one per job, its newest letter)."),
    as_json: bool = _JSON,
    wide: bool = WIDE_OPTION,
) -> None:
    """The DLQ in jobs, letters and repeats, the reasons (whole DLQ), then the most recent
    matching jobs: one row per job, its newest letter and how many letters it has. A
    letter is one DLQ record, a job one job ID; a job has more than one letter when a
    worker was killed between writing its letter and committing, or when it was requeued
    and died again: the letters beyond each job's first are repeats."""
    settings = _settings(ctx)
    since_ms = parse_since(since, now_ms()) if since is not None else None
    listing = asyncio.run(dlq.list_letters(settings, job_type, reason=reason, since_ms=since_ms,
                                           limit=limit, per_letter=every_letter))
    if as_json:
        _print_json({**asdict(listing), "rows": [_row_json(r) for r in listing.rows]})
        return
    _print_counts(listing)
    if listing.pending_drain:
        console.print(f"{counted(listing.pending_drain, 'letter is', 'letters are')} after "
                      "the drain position "
                      f"(`stream-jobs dlq requeue {job_type} --all` would look at those).")
    matching = (counted(listing.matching, "matching letter") if every_letter
                else counted(listing.matching_jobs, "matching job"))
    if not listing.rows:
        console.print(f"{matching} ({counted(listing.matching, 'letter')}); raise --limit to "
                      "see them." if listing.matching else "No letters match.")
        return
    each = "one row per letter" if every_letter else "one row per job, its newest letter"
    console.print(f"{len(listing.rows):,} of {matching}, {each}, most recent last "
                  "(times UTC):")
    print_table(console, rows_table(listing.rows, wide=wide), wide=wide)
    shown = listing.matching if every_letter else listing.matching_jobs
    if shown > len(listing.rows):
        hidden = shown - len(listing.rows)
        what = ("older matching letter is", "older matching letters are") if every_letter \
            else ("older matching job is", "older matching jobs are")
        console.print(f"{counted(hidden, *what)} not shown; raise --limit to see them.")


def _print_counts(listing: dlq.DlqListing) -> None:
    """Jobs beside letters: a job killed mid-write, or requeued and dead again, has more
    than one letter (the repeats)."""
    console.print(f"{listing.topic} holds {counted(listing.letters, 'letter')} of "
                  f"{counted(listing.jobs, 'dead-lettered job')} "
                  f"({counted(listing.repeats, 'repeat')}: letters beyond a job's first).")
    console.print(reasons_table(listing))


def reasons_table(listing: dlq.DlqListing) -> Table:
    reasons = Table()
    reasons.add_column("reason", overflow="fold")
    reasons.add_column("jobs", justify="right", no_wrap=True)
    reasons.add_column("letters", justify="right", no_wrap=True)
    for name, count in listing.reasons.items():
        reasons.add_row(Text(name), f"{listing.job_reasons.get(name, 0):,}", f"{count:,}")
    return reasons


# At 80 columns: the job and why it died (reason, error class); --wide adds the message,
# attempts, how many letters the job left, times, origin and where the letter is.
_ROW_COLUMNS = (job_id_column(), text_column("reason"), text_column("error"),
                text_column("message", wide=True), number_column("attempt", wide=True),
                number_column("requeues", wide=True), number_column("letters", wide=True),
                word_column("failed at", wide=True), word_column("enqueued at", wide=True),
                text_column("origin", wide=True), text_column("partition/offset", wide=True))


def rows_table(rows: list[LetterRow], *, wide: bool) -> FittedTable:
    table = FittedTable(_ROW_COLUMNS, wide=wide)
    for row in rows:
        error = row.error_class.rsplit(".", 1)[-1]
        table.add_row(Text(row.job_id or "-"), Text(row.reason),
                      Text(error if row.runnable else f"{error} (cannot run)"), Text(row.message),
                      _num(row.attempt), str(row.requeues), f"{row.letters:,}",
                      _short_time(row.failed_at_ms), _short_time(row.enqueued_at_ms),
                      Text(row.origin or "-"), f"{row.partition}/{row.offset}")
    return table


@dlq_app.command("show")
def show(ctx: typer.Context, job_type: str = _TYPE,
         job_id: str = typer.Argument(..., metavar="JOB_ID", help="The job's ID."),
         as_json: bool = _JSON) -> None:
    """Everything one dead letter holds: headers, payload, failure and traceback."""
    settings = _settings(ctx)
    detail = asyncio.run(dlq.show_letter(settings, job_type, job_id))
    if as_json:
        _print_json(asdict(detail))
        return
    console.print(facts_table(detail))
    console.print(Text("payload" + ("" if detail.payload_is_json else " (not JSON)"),
                       style="bold"))
    console.print(Text(detail.payload))
    if detail.failure is not None and detail.failure.traceback:
        console.print(Text("traceback", style="bold"))
        console.print(Text(detail.failure.traceback))


def facts_table(detail: dlq.LetterDetail) -> Table:
    facts = Table(title=f"{detail.job_id} in {detail.topic} "
                        f"(partition {detail.partition}, offset {detail.offset})",
                  show_header=False)
    facts.add_column("field", style="bold")
    # A header's value can be a job ID (sj-job-id, sj-rerun-of): never folded.
    facts.add_column("value", overflow="fold", min_width=JOB_ID_WIDTH)
    failure = detail.failure
    facts.add_row("reason", Text(detail.reason))
    if failure is not None:
        facts.add_row("error", Text(f"{failure.error_class}: {failure.message}"))
        facts.add_row("failed at", _time(failure.failed_at_ms))
    if detail.problem is not None:
        facts.add_row("cannot run", Text(f"{detail.problem}: requeue leaves this letter"))
    facts.add_row("attempt", _num(detail.attempt))
    facts.add_row("requeues", str(detail.requeues))
    facts.add_row("key", Text(detail.key if detail.key is not None else "-"))
    facts.add_row("dead-lettered at", _time(detail.timestamp_ms))
    for name, value in detail.headers:
        if name == "sj-error":
            value = "(the failure above)"
        facts.add_row(Text(f"header {name}"), Text(value))
    if len(detail.letters) > 1:
        others = ", ".join(f"{p}/{o}" for p, o in detail.letters)
        facts.add_row("letters", Text(f"{len(detail.letters):,} for this job ({others}); "
                                      "the newest is shown"))
    return facts


@dlq_app.command("requeue")
def requeue(
    ctx: typer.Context,
    job_type: str = _TYPE,
    every: bool = typer.Option(False, "--all", help="Drain: the letters after the drain "
                               "position of group P.T.dlq, one per job (the newest); the "
                               "position then moves past them all."),
    ids: list[str] | None = typer.Option(None, "--id", metavar="JOB_ID",
                                         help="A job ID (repeatable); looks at "
                                         "the whole DLQ."),
    reason: str | None = typer.Option(None, "--reason", help="Letters with this reason; looks "
                                      "at the whole DLQ."),
    reset_attempts: bool = typer.Option(False, "--reset-attempts", help="Start again at attempt "
                                        "1 with every retry (default: one more attempt)."),
    rate: str | None = typer.Option(None, "--rate", help="At most this many letters a second, "
                                    "e.g. 100/s."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; change "
                                 "nothing."),
    force: bool = typer.Option(False, "--force", help="Also requeue letters held back by the "
                               "loop guard, and expired ones (their expiry is cleared)."),
    max_requeues: int = typer.Option(DEFAULT_MAX_REQUEUES, "--max-requeues", min=0,
                                     envvar="STREAM_JOBS_DLQ_MAX_REQUEUES",
                                     help="The loop guard: leave letters requeued this often."),
) -> None:
    """Put dead letters back in their lanes, keeping their job IDs (so ctx.once() dedups):
    one letter per job, its newest; a job's older letters (repeats) are skipped and
    counted, with --all too.

    Safe to interrupt and to run again: nothing is lost and no effect runs twice.
    """
    select = _selection(every, ids, reason)
    rate_per_s = _rate(rate)
    settings = _settings(ctx)
    shown = _RequeueProgress(reset_attempts=reset_attempts, rate_per_s=rate_per_s,
                             dry_run=dry_run)
    try:
        result = asyncio.run(requeue_letters(
            settings, job_type, select=select, reset_attempts=reset_attempts,
            rate_per_s=rate_per_s, dry_run=dry_run, force=force, max_requeues=max_requeues,
            on_plan=shown.planned, on_progress=shown.advanced))
    except KeyboardInterrupt:
        if shown.stop():
            console.print(f"Interrupted after {shown.done:,}. Nothing is lost: run the same "
                          "command again to go on (letters sent twice keep their job IDs, "
                          "so ctx.once() runs them once).")
        raise
    finally:
        shown.stop()
    if not dry_run:
        _print_outcome(result, job_type)


def _selection(every: bool, ids: list[str] | None, reason: str | None) -> Selection:
    chosen = [flag for flag, given in (("--all", every), ("--id", bool(ids)),
                                        ("--reason", reason is not None)) if given]
    if len(chosen) != 1:
        raise ConfigError("Say which letters to requeue with exactly one of --all, --id ID "
                          "(repeatable) or --reason REASON"
                          + (f" (not {' and '.join(chosen)})." if chosen else "."))
    if every:
        return SelectAll()
    if ids:
        return SelectIds(frozenset(ids))
    return SelectReason(reason or "")


class _RequeueProgress:
    """The plan, then a progress bar while a requeue runs (none for a dry run)."""

    def __init__(self, *, reset_attempts: bool, rate_per_s: float | None,
                 dry_run: bool) -> None:
        self._reset_attempts = reset_attempts
        self._rate_per_s = rate_per_s
        self._dry_run = dry_run
        self._bar = Progress(TextColumn("requeue"), BarColumn(), MofNCompleteColumn(),
                             TimeRemainingColumn(), console=console, transient=False)
        self._task: Any = None
        self.done = 0

    def planned(self, plan: RequeuePlan) -> None:
        _print_plan(plan, reset_attempts=self._reset_attempts, rate_per_s=self._rate_per_s)
        if self._dry_run:
            console.print("Dry run: nothing was changed.")
        elif plan.total_work:
            self._bar.start()
            self._task = self._bar.add_task("requeue", total=plan.total_work)

    def advanced(self, n: int) -> None:
        self.done += n
        if self._task is not None:
            self._bar.advance(self._task, n)

    def stop(self) -> bool:
        """Stop the bar if it runs (Progress.stop prints a line even when it never
        started); whether it ran."""
        if self._task is None:
            return False
        self._bar.stop()
        self._task = None
        return True


@dlq_app.command("purge")
def purge(ctx: typer.Context, job_type: str = _TYPE,
          yes: bool = typer.Option(False, "--yes", help="Confirm: delete the letters for good.")
          ) -> None:
    """Delete every letter in the DLQ (letters written meanwhile are kept). Needs --yes."""
    settings = _settings(ctx)
    plan = asyncio.run(dlq.plan_purge(settings, job_type))
    if plan.letters == 0:
        console.print(f"{plan.topic} holds no letters: nothing to purge.")
        return
    never = (f", {plan.pending_drain:,} of them never drained by `requeue --all`"
             if plan.pending_drain else "")
    if not yes:
        raise ConfigError(f"Refusing to delete {counted(plan.letters, 'letter')} from {plan.topic}"
                          f"{never} without --yes: a purge cannot be undone. Look first with "
                          f"`stream-jobs dlq list {job_type}`, then run "
                          f"`stream-jobs dlq purge {job_type} --yes`.")
    console.print(f"Deleting {counted(plan.letters, 'letter')} from {plan.topic}{never}.")
    deleted = asyncio.run(dlq.purge(settings, job_type, plan=plan))
    console.print(f"Deleted {counted(deleted, 'letter')}; letters dead-lettered since are kept.")


# -- printing -------------------------------------------------------------------------------


def _print_plan(plan: RequeuePlan, *, reset_attempts: bool,
                rate_per_s: float | None) -> None:
    if plan.mode == "all":
        where = f"letters after the drain position of group {plan.group}"
    elif plan.mode == "ids":
        where = "the newest letter of each given job ID, in the whole DLQ"
    else:
        where = "the newest letter of each job with that reason, in the whole DLQ"
    console.print(f"Requeue from {plan.topic}: {where}.")
    if plan.mode == "all" and plan.read == 0:
        console.print("  nothing is after the drain position: earlier `--all` runs dealt with "
                      "every letter (`--id` and `--reason` look at the whole DLQ).")
        return
    jobs = plan.selected - plan.superseded
    console.print(f"  looked at {counted(plan.read, 'letter')}; {plan.selected:,} selected, "
                  f"of {counted(jobs, 'job')}")
    if plan.superseded:
        console.print(f"  skipping {counted(plan.superseded, 'repeat')}: one letter per job, "
                      "the newest, is judged and sent")
    lanes = ", ".join(f"{lane} {n:,}" for lane, n in sorted(plan.lanes.items()))
    attempt = ("at attempt 1" if reset_attempts
               else "as its next attempt" if plan.to_requeue == 1 else "as their next attempt")
    pace = f", at most {rate_per_s:g}/s" if rate_per_s else ""
    console.print(f"  will requeue {plan.to_requeue:,} {attempt}{pace}"
                  + (f" (lanes: {lanes})" if lanes else ""))
    hints = {
        Verdict.LOOP_GUARD: "requeued too often already (the loop guard; --force)",
        Verdict.EXPIRED: "past their expiry (--force clears it)",
        Verdict.UNDECODABLE: "cannot run: "
        + ", ".join(f"{r} {n:,}" for r, n in plan.undecodable_reasons.most_common()),
    }
    for verdict, why in hints.items():
        count = plan.verdicts[verdict]
        if count:
            sample = ", ".join(plan.samples.get(verdict, []))
            console.print(Text(f"  will leave {count:,} {why}; e.g. {sample}"))


def _print_outcome(result: RequeueResult, job_type: str) -> None:
    plan = result.plan
    done = f"Requeued {counted(result.requeued, 'letter')}"
    if plan.superseded:
        done += f" (one per job; {counted(plan.superseded, 'repeat')} skipped)"
    if plan.mode == "all":
        done += f"; the drain position moved past {result.drained:,}"
    console.print(done + ". Requeued letters stay in the DLQ until its retention or a purge.")
    if plan.left and plan.mode == "all":
        console.print(f"Letters left behind are still listed by `stream-jobs dlq list {job_type}`;"
                      f" requeue one later with `stream-jobs dlq requeue {job_type} --id ID "
                      "--force`.")


def _row_json(row: LetterRow) -> dict[str, Any]:
    out = asdict(row)
    out["failed_at"] = _iso(row.failed_at_ms)
    out["enqueued_at"] = _iso(row.enqueued_at_ms)
    return out


def _print_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
                     .decode() + "\n")


def _short_time(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _time(ms: int | None) -> str:
    return _iso(ms) or "-"


def _iso(ms: int | None) -> str | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _rate(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)  # a bare number is per second
    except ValueError:
        return parse_rate(text)
    if not value > 0:
        raise ConfigError(f"--rate {text!r} is not a rate above zero; write e.g. 100/s.")
    return value



def _settings(ctx: typer.Context) -> Settings:
    # aiokafka logs every failed connection at ERROR; the CLI says it once, in a sentence.
    if not logging.getLogger().handlers:
        logging.getLogger("aiokafka").addHandler(logging.NullHandler())
        logging.getLogger("aiokafka").propagate = False
    return settings_of(ctx)
