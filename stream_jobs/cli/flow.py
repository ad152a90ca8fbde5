"""`stream-jobs throttle TYPE RATE` and `stream-jobs drain TYPE --rate RATE`: change a
type's rate limit at run time (through `P._control`), and watch a backlog drain; with
`--tenant`, one tenant's rate (`stream_jobs.cli.tenant_throttle`)."""

from __future__ import annotations

import asyncio
import time

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from stream_jobs.cli.common import app, settings_of
from stream_jobs.cli.tables import WIDE_OPTION
from stream_jobs.cli.tenant_throttle import show_tenants, throttle_tenant
from stream_jobs.clock import now_ms
from stream_jobs.dlq.census import DlqCensus
from stream_jobs.durations import parse_rate
from stream_jobs.errors import ConfigError
from stream_jobs.job_types import JobTypePolicy, get_job_type, load_job_types
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.plurals import counted
from stream_jobs.runtime.throttle import RateInForce, publish_rate, rate_in_force, read_overrides
from stream_jobs.settings import Settings
from stream_jobs.tools.stats import collect
from stream_jobs.tools.type_stats import TypeStats

console = Console()
status_console = Console(stderr=True)

_UNLIMITED = ("none", "off", "unlimited")


def _load(ctx: typer.Context, job_type: str) -> tuple[Settings, dict[str, JobTypePolicy]]:
    settings = settings_of(ctx)
    types = load_job_types(settings.topics_dir)
    get_job_type(types, job_type)  # an unknown type is one sentence, before any I/O
    return settings, types


def _parse(rate: str) -> float | None:
    if rate.strip().lower() in _UNLIMITED:
        return None
    try:
        return parse_rate(rate)
    except ConfigError as exc:
        raise ConfigError(f"{rate!r} is not a rate: write e.g. 50/s or 600/m, or 'none' to "
                          "lift the limit.") from exc


def _spell(rate: RateInForce) -> str:
    limit = "no limit" if rate.per_s is None else f"{rate.per_s:g}/s"
    return f"{limit} ({rate.source})"


async def _current(settings: Settings, policy: JobTypePolicy) -> RateInForce:
    async with open_reader(settings) as consumer:
        overrides = await read_overrides(consumer, settings.topic_prefix)
    return rate_in_force(policy.rate_limit_per_s, overrides.get(policy.job_type))


async def _set(settings: Settings, policy: JobTypePolicy, rate: float | None, *, by: str,
               reset: bool, at_ms: int) -> tuple[RateInForce, RateInForce]:
    before = await _current(settings, policy)
    await publish_rate(settings, policy.job_type, rate, at_ms=at_ms, by=by, reset=reset)
    return before, await _current(settings, policy)



@app.command("throttle")
def throttle(
    ctx: typer.Context,
    job_type: str = typer.Argument(..., metavar="TYPE"),
    rate: str | None = typer.Argument(None, metavar="RATE", show_default=False,
                                      help="Jobs per unit across all workers, e.g. 50/s or "
                                           "600/m; 'none' lifts the limit. Omitted: show it."),
    reset: bool = typer.Option(False, "--reset", help="Back to the TOML's rate_limit (with "
                               "--tenant: to the rate its [fairness] table gives the tenant)."),
    tenant: str | None = typer.Option(None, "--tenant", help="One tenant's rate across the "
                                      "fleet instead of the type's (a type with [fairness]); "
                                      "kept in Postgres."),
    tenants: bool = typer.Option(False, "--tenants", help="Show every tenant's limits and "
                                 "running jobs now."),
    wide: bool = WIDE_OPTION,
) -> None:
    """Change TYPE's rate limit for every running worker, without a restart.

    The limit is shared across the type's workers by partition ownership and holds until
    the next `throttle` (or `--reset`), restarts included. With --tenant it is one tenant's
    rate, shared by the workers through Postgres (docs/fairness.md).
    """
    at_ms = now_ms()
    settings, types = _load(ctx, job_type)
    policy = types[job_type]
    if rate is not None and reset:
        raise ConfigError("Give a RATE or --reset, not both.")
    if tenants:
        if tenant is not None or rate is not None or reset:
            raise ConfigError("--tenants shows the tenants' limits; set one with --tenant "
                              "NAME RATE instead.")
        show_tenants(settings, policy, wide=wide)
        return
    per_s = None if rate is None else _parse(rate)
    if tenant is not None:
        throttle_tenant(settings, policy, tenant, per_s, change=rate is not None, reset=reset)
        return
    if rate is None and not reset:
        console.print(f"{job_type}: {_spell(asyncio.run(_current(settings, policy)))}")
        return
    before, after = asyncio.run(_set(settings, policy, per_s, by="throttle", reset=reset,
                                     at_ms=at_ms))
    console.print(f"{job_type}: {_spell(before)} -> {_spell(after)}; running workers apply "
                  "it within a second (`stream-jobs stats` shows what they report).")


@app.command("drain")
def drain(
    ctx: typer.Context,
    job_type: str = typer.Argument(..., metavar="TYPE"),
    rate: str | None = typer.Option(None, "--rate", help="Set the pace first (like "
                                    "`throttle`), e.g. 200/s; omitted: keep the limit."),
    interval_s: float = typer.Option(1.0, "--interval", min=0.1,
                                     help="Seconds between progress updates."),
    timeout_s: float | None = typer.Option(None, "--timeout", min=1.0, help="Give up watching "
                                           "after this many seconds (exit code 3)."),
) -> None:
    """Drain TYPE's backlog at a set pace; watch until its lanes are empty (or Ctrl-C).

    Jobs past their expiry are acknowledged without running and counted as expired (they
    take no share of the rate). The rate stays in force when the drain ends; `throttle
    TYPE --reset` returns to the TOML's.
    """
    at_ms = now_ms()
    settings, types = _load(ctx, job_type)
    policy = types[job_type]
    per_s = None if rate is None else _parse(rate)

    async def run() -> int:
        if rate is not None:
            before, after = await _set(settings, policy, per_s, by="drain", reset=False,
                                       at_ms=at_ms)
            status_console.print(f"{job_type}: {_spell(before)} -> {_spell(after)}")
        return await _watch(settings, types, job_type, interval_s, timeout_s)

    try:
        code = asyncio.run(run())
    except KeyboardInterrupt:
        console.print("stopped watching; the workers go on draining at the rate in force.")
        raise typer.Exit(130) from None
    if code:
        raise typer.Exit(code)


async def _watch(settings: Settings, types: dict[str, JobTypePolicy], job_type: str,
                 interval_s: float, timeout_s: float | None) -> int:
    started = time.monotonic()
    census = DlqCensus()  # each refresh reads only the letters dead-lettered since

    async def snapshot() -> TypeStats:
        window_s = max(1.0, time.monotonic() - started)
        shot = await collect(settings, types, job_type=job_type, window_s=window_s,
                             census=census)
        return shot.types[0]

    first = await snapshot()
    total = max(first.lag, 1)
    progress = Progress(TextColumn("drain {task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
                        TimeElapsedColumn(), console=status_console, transient=True)
    current = first
    with progress:
        task = progress.add_task(job_type, total=total, detail="")
        while current.lag > 0:
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                console.print(f"{job_type}: {counted(current.lag, 'job')} still waiting after "
                              f"{timeout_s:g} s; the workers go on.")
                return 3
            await asyncio.sleep(interval_s)  # the refresh period, not a wait for a state
            current = await snapshot()
            total = max(total, current.lag)  # new jobs arrived meanwhile
            per_s = current.rates.per_s()
            lanes = ", ".join(f"{lane.name} {lane.lag:,}" for lane in current.lanes)
            progress.update(task, total=total, completed=total - current.lag,
                            detail=f"{lanes} | {per_s['done']:.1f} done/s, "
                                   f"{per_s['expired']:.1f} expired/s | {_spell(current.rate)}")
    counts = current.rates.counts
    console.print(f"{job_type}: drained in {time.monotonic() - started:.1f} s; workers reported "
                  f"{counts.done:,} done, {counts.expired:,} expired, {counts.retried:,} "
                  f"retried, {counts.dead_lettered:,} dead-lettered meanwhile; rate "
                  f"{_spell(current.rate)}.")
    return 0
