"""`stream-jobs demo`: the main job end to end on the local stack, with live progress.

It starts the stack if needed, applies the demo types as `consumers/demo_topics/` declares
them (`topics/`'s, with delay tiers of seconds, so it ends in under a minute), runs a
worker per type, enqueues a mixed load (jobs that succeed, fail once, always fail, and
malformed records), and ends with a
table of outcomes and a check that every effect happened exactly once. Each run uses its
own topic prefix and Postgres schema, so its counts are its own; its own history process
runs beside the workers, and the run ends once the history in Postgres counts what the
workers counted, so `stream-jobs serve` on the run's prefix and schema has its charts.
The run's settings are written to `.stack/demo.env` for that: `make demo-serve` opens the
dashboard on the last run, with the demo's own declarations.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from stream_jobs.app import App
from stream_jobs.cli.common import app, run_fast, settings_of
from stream_jobs.cli.stats import render_stats
from stream_jobs.client import Job, JobClient
from stream_jobs.clock import now_ms
from stream_jobs.errors import ConfigError
from stream_jobs.history.store import HistoryStore
from stream_jobs.history.tally import Tally, total
from stream_jobs.history.windows import window_start
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import lane_topic
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.postgres.pool import connect
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer
from stream_jobs.tools.stats import collect

# Wide enough for the tables when output is piped (make, CI logs).
console = Console(width=None if sys.stdout.isatty() else 110)

# How long the history may take to fold the workers' last reports into Postgres once they
# are idle (it starts with the run; a report every second, written within a second).
HISTORY_WITHIN_S = 60.0

# The demo's job types: topics/'s, with delay tiers of seconds (a folder of their own, so
# the dashboard of a run reads the tiers the run really has).
DEMO_TOPICS = Path("consumers/demo_topics")

# Records no client would send: each must end in the DLQ with its reason.
MALFORMED: list[tuple[str, bytes, list[tuple[str, bytes]]]] = [
    ("email.send", b"\x00\x01 not json", [("sj-job-id", b"bad-bytes-1"),
                                           ("sj-type", b"email.send")]),
    ("email.send", b'{"to": "nobody"}', []),  # no headers at all
    ("search.index", b'{"doc_id": 5}', [("sj-job-id", b"bad-model-1"),
                                        ("sj-type", b"search.index")]),
    ("image.resize", b'{"image_id": "x", "width": 1}', [("sj-job-id", b"wrong-type-1"),
                                                        ("sj-type", b"video.encode")]),
]


@app.command("demo")
def demo(
    ctx: typer.Context,
    start_stack: bool = typer.Option(True, "--start-stack/--no-start-stack",
                                     help="Start the local Kafka and Postgres if needed."),
    seed: int = typer.Option(7, help="Seed of the scenario's random choices."),
) -> None:
    """Run the demo app on the local stack and check every effect happened exactly once,
    and that the run's history counts every outcome once."""
    settings = run_settings(settings_of(ctx), time.strftime("%Y%m%d%H%M%S"))
    if start_stack:
        with console.status("starting the local stack (Kafka, Postgres)"):
            KafkaCluster(settings, 1).up()
            PostgresServer(settings).up()
    # Worker warnings (each dead letter, each retry-write failure) go to a file, not
    # over the live table.
    log_file = settings.stack_dir / "demo.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=log_file, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    console.print(f"worker logs: {log_file}")
    write_env(settings)
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module("consumers.demo")
    except ImportError as exc:
        raise ConfigError("The demo app consumers/demo.py was not found: run the demo from "
                          "the project's checkout.") from exc
    ok = run_fast(_run(settings, module, random.Random(seed)))
    if not ok:
        raise typer.Exit(1)


def run_settings(base: Settings, stamp: str) -> Settings:
    """A run's settings: its own prefix and schema, and the demo's declarations."""
    return base.model_copy(update={"topic_prefix": f"demo-{stamp}",
                                   "database_schema": f"demo_{stamp}",
                                   "topics_dir": DEMO_TOPICS})


def env_file(settings: Settings) -> Path:
    return settings.stack_dir / "demo.env"


def write_env(settings: Settings) -> None:
    """The run's prefix, schema and declarations as shell exports, for `make demo-serve`
    (`stream-jobs serve` on the last run)."""
    env_file(settings).write_text(
        f"export STREAM_JOBS_TOPIC_PREFIX={settings.topic_prefix}\n"
        f"export STREAM_JOBS_DATABASE_SCHEMA={settings.database_schema}\n"
        f"export STREAM_JOBS_TOPICS_DIR={settings.topics_dir.resolve()}\n")


async def _run(settings: Settings, module: Any, rng: random.Random) -> bool:
    demo_app: App = module.app
    demo_app.use_settings(settings)
    types = demo_types(settings, demo_app)
    console.print(f"demo run [bold]{settings.topic_prefix}[/] on {settings.kafka_bootstrap}, "
                  f"its types from {settings.topics_dir}/ (delay tiers of seconds, so it ends "
                  "in under a minute)")
    await prepare_schema(settings, module.SCHEMA)
    await apply(settings, types)
    # The run's own history process, in this process from the start (it reads the
    # reports from the beginning): its windows stay in the run's schema for `serve`.
    from stream_jobs.history.process import run_history  # faust: only for this command

    stop = asyncio.Event()
    history = asyncio.create_task(run_history(settings, stop))
    since_ms = now_ms()
    try:
        workers, ok = await _work(settings, module, rng, types, since_ms)
        ok = await _check_history(settings, workers, history, since_ms) and ok
    finally:
        stop.set()
        await asyncio.wait({history})
    history.result()  # a history that crashed fails the demo with its reason
    return ok


def demo_types(settings: Settings, demo_app: App) -> dict[str, JobTypePolicy]:
    """The types the demo applies and runs: its handlers' declarations, as read from the
    run's topics folder (what `stream-jobs serve` on `.stack/demo.env` reads too)."""
    declared = load_job_types(settings.topics_dir)
    missing = sorted(set(demo_app.handlers) - set(declared))
    if missing:
        raise ConfigError(f"The demo needs {settings.topics_dir}/{missing[0]}.toml.")
    return {name: declared[name] for name in demo_app.handlers}


async def _work(settings: Settings, module: Any, rng: random.Random,
                types: dict[str, JobTypePolicy], since_ms: int) -> tuple[dict[str, Worker], bool]:
    """Enqueue the scenario, run a worker per type until idle, check effects and stats."""
    demo_app: App = module.app
    jobs, expected = module.scenario(rng)
    started = time.monotonic()
    async with JobClient(settings, types, models=demo_app.models()) as client:
        await client.enqueue_many([Job(t, p, key=k, priority=lane) for t, p, k, lane in jobs])
    await _produce_malformed(settings)
    malformed = {t: sum(1 for m in MALFORMED if m[0] == t) for t in types}
    console.print(f"enqueued {len(jobs)} jobs and {len(MALFORMED)} malformed records in "
                  f"{time.monotonic() - started:.1f} s")

    workers = {t: Worker(settings, types[t], demo_app.handler(t), report_interval_s=1.0)
               for t in sorted(types)}
    runs = [asyncio.create_task(w.run(until_idle=True)) for w in workers.values()]
    with Live(_progress(workers, expected, malformed), console=console,
              refresh_per_second=4) as live:
        while not all(r.done() for r in runs):
            await asyncio.wait(runs, timeout=0.25)
            live.update(_progress(workers, expected, malformed))
    for run in runs:
        run.result()  # a worker that crashed fails the demo loudly
    console.print(f"\nall workers idle after {time.monotonic() - started:.1f} s")
    effects_ok = await _check(settings, module.EFFECT_TABLES, workers, expected, malformed)
    stats_ok = await _check_stats(settings, types, expected, malformed, since_ms)
    return workers, stats_ok and effects_ok


async def _check_stats(settings: Settings, types: dict[str, JobTypePolicy],
                       expected: dict[str, Any], malformed: dict[str, int],
                       since_ms: int) -> bool:
    """What `stream-jobs stats` shows must match what the demo enqueued."""
    # A window from the run's start to the reading, so the rates are the run's and the
    # counts all of it, however long the reading takes on a loaded machine.
    shot = await collect(settings, types, since_ms=since_ms)
    console.print(render_stats(shot, settings, partitions=False))
    ok = True
    for t in shot.types:
        want = expected[t.job_type]
        dead = want.dead_lettered + malformed[t.job_type]
        counts = t.rates.counts
        if (t.lag, t.dlq_depth, counts.done, counts.dead_lettered) != (0, dead, want.succeeded,
                                                                        dead):
            ok = False
            console.print(f"[red]stats for {t.job_type} do not match: lag {t.lag}, DLQ "
                          f"{t.dlq_depth}, done {counts.done}, dead-lettered "
                          f"{counts.dead_lettered}[/]")
    if ok:
        console.print("[green]stats match: no lag, and done and dead-lettered counts equal "
                      "what was enqueued[/]")
    return ok


async def _produce_malformed(settings: Settings) -> None:
    async with JobProducer(settings) as producer:
        for job_type, value, headers in MALFORMED:
            await producer.send_raw(lane_topic(settings.topic_prefix, job_type), None, value,
                                    headers)


def _progress(workers: dict[str, Worker], expected: dict[str, Any],
              malformed: dict[str, int]) -> Table:
    table = Table(title="demo progress")
    # Short headers: the demo's tables fit an 80-column terminal.
    for column in ("type", "enqueued", "done", "retried", "dead", "expired", "in flight"):
        table.add_column(column, justify="right" if column != "type" else "left")
    for name, worker in workers.items():
        out = worker.outcomes
        table.add_row(name, str(expected[name].enqueued + malformed[name]),
                      f"{out['succeeded']}/{expected[name].succeeded}", str(out["retried"]),
                      f"{out['dead_lettered']}/{expected[name].dead_lettered + malformed[name]}",
                      str(out["expired"]), str(worker.in_flight()))
    return table


async def _check(settings: Settings, tables: dict[str, str], workers: dict[str, Worker],
                 expected: dict[str, Any], malformed: dict[str, int]) -> bool:
    conn = await connect(settings)
    result = Table(title=f"demo outcomes ({settings.topic_prefix})")
    for column in ("type", "enqueued", "succeeded", "retried", "dead", "effects", "job IDs",
                   "once"):
        result.add_column(column, justify="right" if column != "type" else "left")
    ok = True
    try:
        for name, worker in workers.items():
            row = await conn.fetchrow(
                f"SELECT count(*) AS n, count(DISTINCT job_id) AS d FROM {tables[name]}")
            want = expected[name]
            out = worker.outcomes
            good = (row["n"] == row["d"] == want.succeeded == out["succeeded"]
                    and out["dead_lettered"] == want.dead_lettered + malformed[name]
                    and out["retried"] == want.retried)
            ok = ok and good
            result.add_row(name, str(want.enqueued + malformed[name]), str(out["succeeded"]),
                           str(out["retried"]), str(out["dead_lettered"]), str(row["n"]),
                           str(row["d"]), "[green]yes[/]" if good else "[red]NO[/]")
    finally:
        await conn.close()
    console.print(result)
    console.print("[green]every effect happened exactly once[/]" if ok else
                  "[red]the outcomes do not match what was enqueued[/]")
    return ok


async def _check_history(settings: Settings, workers: dict[str, Worker],
                         history: asyncio.Task[Any], since_ms: int) -> bool:
    """The history's windows in Postgres must count each type's outcomes as its workers
    did: in its running totals, and added up over its minute windows (once, in one)."""
    counted = {name: {str(k): n for k, n in w.outcomes.items() if n}
               for name, w in workers.items()}
    store = HistoryStore(settings)
    found: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    began = time.monotonic()
    deadline = began + HISTORY_WITHIN_S
    try:
        # Until its last report is folded and written (or it crashed: the caller raises).
        while not history.done():
            found = await _history_counts(store, list(counted), settings.history_window_s,
                                          since_ms)
            if all(found[t] == (c, c) for t, c in counted.items()) \
                    or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)  # polling the history's writes, with a deadline
    finally:
        await store.close()
    table = Table(title=f"demo history (stream_jobs_history in schema "
                        f"{settings.database_schema})")
    for column in ("type", "outcomes (workers)", "history totals", "minute windows",
                   "exact"):
        table.add_column(column, justify="right" if column != "type" else "left")
    ok = bool(found)
    for name, want in counted.items():
        totals, minutes = found.get(name, ({}, {}))
        exact = totals == minutes == want
        ok = ok and exact
        table.add_row(name, str(sum(want.values())), str(sum(totals.values())),
                      str(sum(minutes.values())), "[green]yes[/]" if exact else "[red]NO[/]")
    console.print(table)
    if ok:
        console.print("[green]history matches: every outcome counted once, in one window[/] "
                      f"(waited {time.monotonic() - began:.1f} s for the last reports); "
                      "the dashboard on this run, its charts included: make demo-serve "
                      f"(it reads {env_file(settings)})", soft_wrap=True)
    else:
        console.print(f"[red]the history does not count what the workers did (after "
                      f"{HISTORY_WITHIN_S:.0f} s; its log lines are in the worker logs)[/]")
    return ok


async def _history_counts(store: HistoryStore, job_types: list[str], minute_s: int,
                          since_ms: int) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """Per type, the outcomes of its running total and of its minute windows since
    `since_ms`, added up."""
    totals = await store.totals()
    out = {}
    for job_type in job_types:
        rows = await store.span(job_type, minute_s, window_start(since_ms, minute_s))
        out[job_type] = (totals.get(job_type, Tally()).outcomes,
                         total([row.tally for row in rows]).outcomes)
    return out
