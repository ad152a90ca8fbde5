"""`stream-jobs stats [TYPE]` and `stream-jobs job JOB_ID`: watch the types, find one job."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import orjson
import typer
from rich.console import Console, Group
from rich.live import Live

from stream_jobs.cli.common import settings_of
from stream_jobs.cli.job_key import print_key_search
from stream_jobs.cli.stats_history import checked_window, print_history, read_history
from stream_jobs.cli.stats_tenants import checked_tenants, print_tenants
from stream_jobs.cli.tables import (
    WIDE_OPTION,
    Column,
    FittedTable,
    number_column,
    print_table,
    text_column,
    word_column,
)
from stream_jobs.dlq.census import DlqCensus
from stream_jobs.errors import ConfigError
from stream_jobs.job_types import JobTypePolicy, get_job_type, load_job_types
from stream_jobs.lookup import DEFAULT_MAX_RECORDS_PER_TOPIC, JobLocation
from stream_jobs.plurals import counted
from stream_jobs.settings import Settings
from stream_jobs.tools.job_status import locate
from stream_jobs.tools.stats import collect
from stream_jobs.tools.tenant_stats import collect_tenants
from stream_jobs.tools.type_stats import DEFAULT_WINDOW_S, StatsSnapshot, TopicLag, TypeStats

console = Console()
status_console = Console(stderr=True)

# Rows normally wait milliseconds; ops/prometheus/alerts.yml fires past a minute too.
OUTBOX_ALERT_AGE_S = 60.0

_STATUS_STYLE = {"done": "green", "finished": "green", "pending": "cyan", "running": "blue",
                 "retrying": "yellow",
                 "scheduled": "cyan", "dead_lettered": "red", "not_seen": "magenta",
                 "cancelled": "yellow", "superseded": "dim"}


def stats(
    ctx: typer.Context,
    job_type: str | None = typer.Argument(None, metavar="TYPE", show_default=False,
                                          help="One job type (default: every declared type)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (for scripts "
                                 "and alerting); with --watch, one per line per refresh."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    interval_s: float = typer.Option(2.0, "--interval", min=0.2, help="Seconds between "
                                     "refreshes with --watch."),
    partitions: bool = typer.Option(False, "--partitions", help="Show every partition."),
    window_s: float = typer.Option(DEFAULT_WINDOW_S, "--window", min=1.0,
                                   help="Seconds the rates are averaged over."),
    history: str | None = typer.Option(
        None, "--history", metavar="1h|24h|7d",
        help="One TYPE's history instead (docs/history.md): jobs by outcome, failure "
        "ratio, jobs/min and duration and dwell percentiles per 5 minutes (1h), hour (24h) "
        "or day (7d); --json gives every window."),
    tenants: bool = typer.Option(
        False, "--tenants", help="One TYPE's top tenants instead (docs/fairness.md): jobs "
        "waiting, in the overflow lane and in flight, and p95 dwell over --window, by "
        "tenant; the rest summed as other."),
    wide: bool = WIDE_OPTION,
) -> None:
    """Lag and oldest job per lane (and the overflow lane), delay-tier depths,
    dead-lettered jobs (and their letters), recent rates and live workers per type, from
    Kafka (worker reports in P._stats give the rates); and the outbox's depth and oldest
    row, from Postgres. With --history, one type's past windows as the history process
    keeps them in Postgres; with --tenants, one type's tenants."""
    if tenants:
        _show_tenants(ctx, job_type, as_json=as_json, watch=watch, partitions=partitions,
                      history=history, window_s=window_s, wide=wide)
        return
    if history is not None:
        _show_history(ctx, job_type, history, as_json=as_json, watch=watch,
                      partitions=partitions)
        return
    settings, types = _load(ctx, job_type)
    census = DlqCensus()  # with --watch, each refresh reads only the new dead letters

    async def snapshot() -> StatsSnapshot:
        return await collect(settings, types, job_type=job_type, per_partition=partitions,
                             window_s=window_s, census=census)

    async def run() -> None:
        if not watch:
            shot = await snapshot()
            if as_json:
                _print_json(shot.to_dict(per_partition=partitions))
            else:
                print_table(console, render_stats(shot, settings, partitions, wide=wide),
                            wide=wide)
            return
        stop = _stop_on_ctrl_c()
        if as_json:
            while (latest := await _unless_stopped(snapshot(), stop)) is not None:
                _print_json(latest.to_dict(per_partition=partitions), indent=False)
                await _pause(interval_s, stop)
            return
        with Live(console=console, auto_refresh=False) as live:
            while (latest := await _unless_stopped(snapshot(), stop)) is not None:
                live.update(render_stats(latest, settings, partitions, wide=wide),
                            refresh=True)
                await _pause(interval_s, stop)

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        return  # a second Ctrl-C ends --watch at once; nothing is left half done


def _show_history(ctx: typer.Context, job_type: str | None, window: str, *, as_json: bool,
                  watch: bool, partitions: bool) -> None:
    """`stats TYPE --history WINDOW`: one type's past windows, read once."""
    window = checked_window(window, job_type, watch=watch, partitions=partitions)
    settings, _ = _load(ctx, job_type)
    assert job_type is not None  # checked_window refuses none
    view = asyncio.run(read_history(settings, job_type, window))
    if as_json:
        _print_json(view.to_dict())
    else:
        print_history(console, view)


def _show_tenants(ctx: typer.Context, job_type: str | None, *, as_json: bool, watch: bool,
                  partitions: bool, history: str | None, window_s: float, wide: bool) -> None:
    """`stats TYPE --tenants`: one type's tenants, read once."""
    job_type = checked_tenants(job_type, watch=watch, partitions=partitions, history=history)
    settings, types = _load(ctx, job_type)
    census = asyncio.run(collect_tenants(settings, types, job_type, window_s=window_s))
    if as_json:
        _print_json(census.to_dict())
    else:
        print_tenants(console, census, wide=wide)


# --watch stops on an event that SIGINT (Ctrl-C) or SIGTERM sets, as the worker, the relay
# and the scheduler do. It relied on Python's KeyboardInterrupt, which Python does not
# install when the command starts with SIGINT ignored (a background job of a script's
# shell): `kill -INT` then left the refresh loop running.
def _stop_on_ctrl_c() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def ctrl_c() -> None:
        if stop.is_set():  # the second: do not wait for the reading in flight
            loop.remove_signal_handler(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        stop.set()

    loop.add_signal_handler(signal.SIGINT, ctrl_c)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    return stop


async def _unless_stopped(reading: Coroutine[Any, Any, StatsSnapshot], stop: asyncio.Event
                          ) -> StatsSnapshot | None:
    """The reading, or None once `stop` is set (the reading in flight is then dropped)."""
    if stop.is_set():
        reading.close()
        return None
    task = asyncio.ensure_future(reading)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done() and not stop.is_set():
        return task.result()
    task.cancel()
    return None


async def _pause(seconds: float, stop: asyncio.Event) -> None:
    """The refresh period, cut short by Ctrl-C."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def job(
    ctx: typer.Context,
    job_id: str | None = typer.Argument(None, metavar="JOB_ID", show_default=False,
                                        help="The ID enqueue returned."),
    job_type: str | None = typer.Option(None, "--type", "-t", help="Scan only this type's "
                                        "topics (default: every declared type)."),
    key: str | None = typer.Option(None, "--key", help="Instead of a JOB_ID: list the jobs "
                                   "of --type whose records carry this Kafka key."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    max_records: int = typer.Option(DEFAULT_MAX_RECORDS_PER_TOPIC, "--max-records", min=1,
                                    help="Records read per topic at most (with --key, the "
                                    "newest)."),
    wide: bool = WIDE_OPTION,
) -> None:
    """What happened to a job: done (dedup row), dead-lettered (with the reason), waiting
    in a delay tier or a lane, running on a worker (its latest report lists the job in a
    handler), finished without a dedup row, cancelled, superseded (by a newer debounced
    job), or not seen. With --key and --type instead of a JOB_ID: the jobs of that type
    whose records carry the key, found by a bounded scan."""
    settings, types = _load(ctx, job_type)
    if (job_id is None) == (key is None):
        raise ConfigError("Give a JOB_ID, or --key with --type, to find jobs by their key.")
    if key is not None:
        if job_type is None:
            raise ConfigError("--key needs --type: a key is looked for in one type's topics.")
        print_key_search(settings, types[job_type], key, max_records=max_records,
                         as_json=as_json, wide=wide)
        return
    assert job_id is not None  # one of the two, checked above

    async def run() -> JobLocation:
        return await locate(settings, types, job_id, job_type=job_type,
                            max_records_per_topic=max_records, records_of_done=True)

    if as_json:
        _print_json(asyncio.run(run()).to_dict())
        return
    with status_console.status(f"looking for job {job_id}"):
        found = asyncio.run(run())
    style = _STATUS_STYLE[found.status]
    console.print(f"[bold {style}]{found.status}[/] {found.summary()}", highlight=False,
                  soft_wrap=True)
    if found.trace_id is not None:
        console.print(f"trace {found.trace_id}", highlight=False, soft_wrap=True)
    if found.tenant is not None:
        console.print(f"tenant {found.tenant}", highlight=False, soft_wrap=True)
    for note in found.notes:
        console.print(f"[dim]{note}[/]", highlight=False, soft_wrap=True)
    if found.sightings:
        print_table(console, records_table(found, wide=wide), wide=wide)


# At 80 columns: where each record of the job is, when it was written, its attempt and
# state; --wide adds its partition and offset.
_RECORD_COLUMNS = (text_column("topic"), number_column("part", wide=True),
                   number_column("offset", wide=True), word_column("written (UTC)"),
                   number_column("attempt"), text_column("state"))


def records_table(found: JobLocation, *, wide: bool) -> FittedTable:
    table = FittedTable(_RECORD_COLUMNS, wide=wide, title=f"records of job {found.job_id} "
                        f"({found.scanned_records:,} scanned)")
    for seen in found.sightings:
        if seen.role == "dlq":
            state = seen.failure.reason if seen.failure else "dead letter"
        else:
            done = "relayed" if seen.role == "tier" else "finished"
            state = done if seen.behind_commit else "waiting"
        table.add_row(seen.topic, str(seen.partition), str(seen.offset),
                      _when(seen.timestamp_ms), str(seen.attempt), state)
    return table


def _load(ctx: typer.Context, job_type: str | None
          ) -> tuple[Settings, dict[str, JobTypePolicy]]:
    settings = settings_of(ctx)
    types = load_job_types(settings.topics_dir)
    if job_type is not None:
        get_job_type(types, job_type)  # an unknown type is one sentence, before any I/O
    return settings, types


def _print_json(document: dict[str, Any], *, indent: bool = True) -> None:
    option = orjson.OPT_INDENT_2 if indent else 0
    sys.stdout.write(orjson.dumps(document, option=option).decode() + "\n")
    sys.stdout.flush()


# The waiting table fits 80 columns whole. The rates at 80 columns: what finished, retried
# and died per second, and who works under which limit; --wide adds the rarer outcomes and
# the jobs in flight. Short headers: rich cuts a header that does not fit ("retried…").
_WAITING_COLUMNS = (text_column("type"), text_column("where"), number_column("jobs"),
                    number_column("oldest"))
_RATE_COLUMNS = (text_column("type"), number_column("done/s"), number_column("retry/s"),
                 number_column("dead/s"), number_column("expired/s", wide=True),
                 number_column("cancel/s", wide=True), number_column("supersede/s", wide=True),
                 number_column("workers"), number_column("in flight", wide=True),
                 Column("limit", justify="right", fold=True))


def render_stats(shot: StatsSnapshot, settings: Settings, partitions: bool, *,
                 wide: bool = False) -> Group:
    waiting = FittedTable(_WAITING_COLUMNS, wide=wide, title=f"waiting under "
                          f"{shot.prefix!r} on {settings.kafka_bootstrap}")
    rates = FittedTable(_RATE_COLUMNS, wide=wide,
                        title=f"last {round(shot.window_s, 1):g} s, from worker reports")
    notes: list[str] = []
    for t in shot.types:
        rows = [(f"lane {lane.name}", _count(lane.lag), _age(lane.oldest_age_s))
                for lane in t.lanes]
        rows += [(f"tier {tier.name}", _count(tier.lag), "") for tier in t.tiers]
        rows.append(_dlq_row(t))
        for i, row in enumerate(rows):
            waiting.add_row(t.job_type if i == 0 else "", *row, end_section=i == len(rows) - 1)
        per_s = t.rates.per_s()
        rates.add_row(t.job_type, *(f"{per_s[k]:.2f}" for k in (
                          "done", "retried", "dead_lettered", "expired", "cancelled",
                          "superseded")),
                      str(len(t.workers)), f"{sum(w.in_flight for w in t.workers):,}",
                      _limit(t))
        if t.heartbeats is not None and t.heartbeats.stuck:
            stuck = t.heartbeats.stuck
            notes.append(f"[red]{t.job_type}: {counted(len(stuck), 'partition')} stuck (no "
                         f"heartbeat processed for over {2 * t.heartbeats.interval_s:g} s): "
                         + ", ".join(f"{p.topic}[{p.partition}]" for p in stuck) + "[/]")
        if t.missing_topics:
            notes.append(f"{t.job_type}: {counted(len(t.missing_topics), 'topic')} missing "
                         f"({', '.join(t.missing_topics)}): run `stream-jobs topics apply`.")
    parts: list[Any] = [waiting, rates, _outbox_line(shot)]
    shadowed = [t for t in shot.types if t.shadow is not None]
    if shadowed:
        parts.append(_shadow_table(shadowed, shot.window_s, wide=wide))
    if partitions:
        parts.append(_partition_table(shot, wide=wide))
    parts.extend(f"[yellow]{note}[/]" for note in notes)
    return Group(*parts)


def _dlq_row(t: TypeStats) -> tuple[str, str, str]:
    """The DLQ in jobs (distinct job IDs), its letters beside: a job can have several."""
    if t.dlq is None:
        return "dlq", _count(t.dlq_depth, alarm=True), ""
    return (f"dlq ({counted(t.dlq.letters, 'letter')})", _count(t.dlq.jobs, alarm=True), "")


def _outbox_line(shot: StatsSnapshot) -> str:
    """The outbox's depth; red once its oldest row is older than the alert's minute."""
    box = shot.outbox
    if box is None:
        return f"[yellow]outbox: unknown ({shot.outbox_problem})[/]"
    age = _age(box.oldest_age_s)
    stuck = box.oldest_age_s is not None and box.oldest_age_s > OUTBOX_ALERT_AGE_S
    text = (f"outbox (schema {box.schema}): {counted(box.depth, 'row')} waiting, oldest {age}"
            + (f", {box.retrying:,} retrying" if box.retrying else ""))
    return f"[red]{text}[/]" if stuck else text


_SHADOW_COLUMNS = (text_column("type"), number_column("shadow read"), number_column("bad"),
                   number_column("processed"), number_column("shadow lag"),
                   number_column("worker lag", wide=True), number_column("shadows"))


def _shadow_table(types: list[TypeStats], window_s: float, *, wide: bool) -> FittedTable:
    """Shadow groups next to the real ones: over the window, records the shadows read
    against jobs the workers finished; and how far behind each group is (the workers'
    lag with --wide)."""
    # A title no wider than the table: rich wraps a longer one.
    table = FittedTable(_SHADOW_COLUMNS, wide=wide, title=f"shadow vs worker, last "
                        f"{window_s:g} s: records read, jobs processed")
    for t in types:
        shadow = t.shadow
        assert shadow is not None
        table.add_row(t.job_type, f"{shadow.window_seen:,}",
                      _count(shadow.window_undecodable, alarm=True),
                      f"{shadow.worker_processed:,}", f"{shadow.lag:,}", f"{t.lag:,}",
                      str(len(shadow.shadows)))
    return table


# At 80 columns each partition's commit, lag and oldest job; --wide adds its first and end
# offsets. Short headers: with long topic names the table still fits.
_PARTITION_COLUMNS = (text_column("topic"), number_column("part"),
                      number_column("start", wide=True), number_column("end", wide=True),
                      number_column("commit"), number_column("lag"), number_column("oldest"))


def _partition_table(shot: StatsSnapshot, *, wide: bool) -> FittedTable:
    beats = {(b.topic, b.partition): b for t in shot.types if t.heartbeats is not None
             for b in t.heartbeats.partitions}
    columns = (*_PARTITION_COLUMNS, *([word_column("heartbeat")] if beats else []))
    table = FittedTable(columns, wide=wide, title="per partition (lanes: lag behind the "
                        "worker group; tiers: not yet relayed)")
    rows: list[TopicLag] = [lag for t in shot.types for lag in (*t.lanes, *t.tiers)]
    for lag in rows:
        for p in lag.partitions:
            cells = [lag.topic, str(p.partition), f"{p.beginning:,}", f"{p.end:,}",
                     "-" if p.committed is None else f"{p.committed:,}", f"{p.lag:,}",
                     _age(p.oldest_age_s)]
            if beats:
                beat = beats.get((lag.topic, p.partition))
                cells.append("" if beat is None else
                             f"{'[red]' if beat.state == 'stuck' else ''}{beat.state} "
                             f"{_age(beat.age_s)}{'[/]' if beat.state == 'stuck' else ''}")
            table.add_row(*cells)
    return table


def _limit(t: TypeStats) -> str:
    """The rate limit in force: '50/s throttle', '200/s' (from the TOML) or '-'."""
    if t.rate.per_s is None:
        return "-" if t.rate.source == "none" else f"none ({t.rate.source})"
    return f"{t.rate.per_s:g}/s" + ("" if t.rate.source == "toml" else f" {t.rate.source}")


def _count(value: int | None, *, alarm: bool = False) -> str:
    if value is None:
        return "[red]missing[/]"
    return f"[red]{value:,}[/]" if alarm and value else f"{value:,}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours < 48 else f"{hours // 24}d{hours % 24:02d}h"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
