"""Periodic jobs on the real stack: one leader per type, each firing once, takeover,
a firing enqueued twice counted as a duplicate, payloads computed at fire time, and
the operator's commands (list, pause, resume, trigger)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol
from zoneinfo import ZoneInfo

import asyncpg
import orjson
import pytest

from ops.chaos.collect import read_topic
from stream_jobs.app import App
from stream_jobs.client import JobClient
from stream_jobs.context import JobContext
from stream_jobs.job_ids import job_id_time_ms
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import lane_topic
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.schedules import Scheduler, firing_job_id
from stream_jobs.schedules.leader import leaders
from stream_jobs.schedules.state import read_states
from stream_jobs.settings import Settings
from tests.waiting import until

from .cli_env import settings_env
from .test_operator_cli import CLI, ROOT

TICK = "tick.beat"
EVERY_SECOND = '[[schedules]]\nname = "beat"\nevery = "1s"\npayload = {source = "toml"}\n'
EFFECTS = "CREATE TABLE tick_effects (job_id text NOT NULL, at timestamptz DEFAULT now())"


def _firings(settings: Settings, policy: JobTypePolicy) -> partial[JobClient]:
    """The client a scheduler sends its firings with, as `App.scheduler` makes it."""
    return partial(JobClient, settings, {policy.job_type: policy})


async def declare(settings: Settings, toml: str = EVERY_SECOND,
                  job_type: str = TICK) -> JobTypePolicy:
    (settings.topics_dir / f"{job_type}.toml").write_text(f"partitions = 2\n{toml}")
    types = load_job_types(settings.topics_dir)
    await apply(settings, types)
    return types[job_type]


class Runner(Protocol):
    def request_stop(self) -> None: ...
    async def run(self) -> None: ...


Start = Callable[[Runner], "asyncio.Task[None]"]


@pytest.fixture
async def running(app: App) -> AsyncIterator[Start]:
    """Start schedulers and workers as tasks; whatever a test leaves running is stopped
    before its schema is dropped (a failed assertion would otherwise leave them at it)."""
    started: list[tuple[Runner, asyncio.Task[None]]] = []

    def start(runner: Runner) -> asyncio.Task[None]:
        task = asyncio.create_task(runner.run())
        started.append((runner, task))
        return task

    yield start
    for runner, _ in started:
        runner.request_stop()
    for _, task in started:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


@pytest.fixture
async def db(settings: Settings, app: App) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        await conn.execute(EFFECTS)
        yield conn
    finally:
        await conn.close()


def with_effects(app: App) -> None:
    @app.job(TICK, concurrency=8)
    async def beat(job: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO tick_effects (job_id) VALUES ($1)", ctx.job_id)


async def lane_ids(settings: Settings) -> list[str]:
    records = await read_topic(settings, lane_topic(settings.topic_prefix, TICK))
    return [dict(r.headers)[HEADER_JOB_ID].decode() for r in records]


def assert_firings(settings: Settings, ids: list[str], name: str = "beat") -> list[int]:
    """Each ID is a firing of `name`, and the firings are consecutive seconds, none twice."""
    times = sorted(t for t in (job_id_time_ms(i) for i in ids) if t is not None)
    assert len(times) == len(ids), "an ID that is not a firing's"
    assert len(set(ids)) == len(ids), f"a firing enqueued twice: {ids}"
    assert all(firing_job_id(settings.topic_prefix, TICK, name, t) in ids for t in times)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert set(gaps) <= {1000}, f"firings missed: gaps {gaps}"
    return times


async def _run(settings: Settings, *args: str) -> tuple[int, str, str]:
    # Wide enough that a table row is one line.
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=ROOT, env=settings_env(settings, COLUMNS="250"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def stopped(runner: Scheduler, task: asyncio.Task[None]) -> None:
    runner.request_stop()
    await asyncio.wait_for(task, 30)


async def test_two_schedulers_fire_each_firing_once_and_the_other_takes_over(
        settings: Settings, app: App, running: Start) -> None:
    policy = await declare(settings)
    a = Scheduler(settings, policy, policy.schedules, client=_firings(settings, policy),
                       holder="test scheduler a")
    b = Scheduler(settings, policy, policy.schedules, client=_firings(settings, policy),
                       holder="test scheduler b")
    tasks = {a: running(a), b: running(b)}
    await until(lambda: a.fired + b.fired >= 3, "three firings", within_s=30)
    assert a.is_leader != b.is_leader, "one leader, not two, not none"
    leader, other = (a, b) if a.is_leader else (b, a)
    assert other.fired == 0
    assert (await leaders(settings, [TICK]))[TICK] == leader.leadership.holder
    await stopped(leader, tasks[leader])
    took = await until(lambda: other.is_leader, "the other scheduler leads", within_s=10)
    assert took < 2.0, f"takeover after a clean stop took {took:.1f} s"
    await until(lambda: other.fired >= 2, "the new leader fires", within_s=10)
    await stopped(other, tasks[other])
    ids = await lane_ids(settings)
    assert len(ids) == a.fired + b.fired
    assert_firings(settings, ids)


async def test_a_refired_firing_is_a_duplicate_not_a_second_run(
        settings: Settings, app: App, db: Any, running: Start) -> None:
    await declare(settings)
    with_effects(app)
    worker = app.worker(TICK)  # every worker of a type runs its scheduler
    assert worker.scheduler is not None
    task = running(worker)

    async def effects() -> int:
        return int(await db.fetchval("SELECT count(*) FROM tick_effects"))

    await until(lambda: _at_least(effects, 3), "three firings ran", within_s=30)
    worker.request_stop()
    await asyncio.wait_for(task, 60)
    # A leader that died after its enqueue and before its commit leaves the horizon
    # behind: the next leader enqueues those firings again, under the same job IDs.
    await db.execute("UPDATE stream_jobs_schedules SET horizon_ms = horizon_ms - 2000")
    again = app.worker(TICK)
    task = running(again)
    await until(lambda: again.outcomes["duplicate"] >= 2, "the refired firings are "
                "duplicates", within_s=30)
    await until(lambda: again.outcomes["succeeded"] >= 1, "new firings run", within_s=30)
    again.request_stop()
    await asyncio.wait_for(task, 60)
    rows = [r["job_id"] for r in await db.fetch("SELECT job_id FROM tick_effects")]
    assert len(rows) == len(set(rows)), "a firing's effect happened twice"
    assert_firings(settings, rows)
    ids = await lane_ids(settings)
    assert len(ids) - len(set(ids)) >= 2  # enqueued twice, run once


async def _at_least(count: Any, n: int) -> bool:
    return bool(await count() >= n)


async def test_a_payload_computed_at_fire_time_carries_the_fire_time(
        settings: Settings, app: App, running: Start) -> None:
    policy = await declare(settings, toml="")

    @app.periodic(TICK, name="stamped", every="1s")
    async def stamped(fire_time: datetime) -> dict[str, Any]:
        return {"fire": fire_time.isoformat(), "ms": round(fire_time.timestamp() * 1000)}

    runner = app.scheduler(TICK)
    assert runner is not None
    assert runner.specs[0].in_code
    task = running(runner)
    await until(lambda: runner.fired >= 2, "two firings", within_s=30)
    await stopped(runner, task)
    records = await read_topic(settings, lane_topic(settings.topic_prefix, TICK))
    assert records
    assert policy.schedules == ()
    for record in records:
        body = orjson.loads(record.value or b"")
        job_id = dict(record.headers)[HEADER_JOB_ID].decode()
        assert job_id == firing_job_id(settings.topic_prefix, TICK, "stamped", body["ms"])
        assert datetime.fromisoformat(body["fire"]).timestamp() * 1000 == body["ms"]


async def test_a_killed_lock_session_hands_the_lead_to_the_other(
        settings: Settings, app: App, running: Start) -> None:
    policy = await declare(settings)
    a = Scheduler(settings, policy, policy.schedules, client=_firings(settings, policy),
                       holder="test scheduler a", lease_s=2)
    b = Scheduler(settings, policy, policy.schedules, client=_firings(settings, policy),
                       holder="test scheduler b", lease_s=2)
    tasks = [running(a), running(b)]
    await until(lambda: a.fired + b.fired >= 2, "two firings", within_s=30)
    leader = a if a.is_leader else b
    conn = await asyncpg.connect(settings.database_url)
    try:
        # As a Postgres restart or a cut connection would: the session and its lock end.
        killed = await conn.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name "
            "= $1", leader.leadership.holder)
    finally:
        await conn.close()
    assert killed
    began = time.monotonic()
    fired_before = a.fired + b.fired
    await until(lambda: a.fired + b.fired >= fired_before + 3, "firing goes on", within_s=30)
    print(f"\nfiring went on {time.monotonic() - began:.2f} s after the lock session ended")
    for runner, task in zip((a, b), tasks, strict=True):
        await stopped(runner, task)
    assert_firings(settings, await lane_ids(settings))


async def test_pause_resume_trigger_and_list_from_the_cli(
        settings: Settings, app: App, running: Start) -> None:
    policy = await declare(settings)
    runner = Scheduler(settings, policy, policy.schedules, client=_firings(settings, policy),
                       holder="test scheduler")
    task = running(runner)
    await until(lambda: runner.fired >= 1, "a firing", within_s=30)

    code, out, err = await _run(settings, "schedules", "list", "--wide")
    assert code == 0, err
    line = next(row for row in out.splitlines() if "beat" in row)
    assert TICK in line, out
    assert "every 1s" in line, out
    assert "test scheduler" in line, out

    code, _, err = await _run(settings, "schedules", "pause", "beat")
    assert code == 0, err
    assert "paused" in err
    fired = runner.fired
    passes = runner.paused_passes.get("beat", 0)
    await until(lambda: runner.paused_passes.get("beat", 0) >= passes + 2,
                "the scheduler looked at the paused schedule twice", within_s=30)
    assert runner.fired == fired, "a paused schedule fired"
    code, out, _ = await _run(settings, "schedules", "list")
    assert "paused" in next(row for row in out.splitlines() if "beat" in row)

    resumed_ms = time.time() * 1000
    code, _, err = await _run(settings, "schedules", "resume", "beat")
    assert code == 0, err
    assert "resumed" in err
    await until(lambda: runner.fired >= fired + 1, "firing again after resume", within_s=30)

    code, out, err = await _run(settings, "schedules", "trigger", "beat")
    assert code == 0, err
    triggered = out.strip()
    await stopped(runner, task)
    ids = await lane_ids(settings)
    assert triggered in ids
    fired_ids = [i for i in ids if i != triggered]
    times = sorted(t for t in map(job_id_time_ms, fired_ids) if t is not None)
    # Nothing due while paused was caught up: after the pause, the next firing is later
    # than the resume (less a second of clock difference with the database).
    paused_gap = max(b - a for a, b in itertools.pairwise(times))
    assert paused_gap > 1000
    assert next(t for t in times if t > times[0] and t - 1000 not in times) > resumed_ms - 1500
    assert len(set(fired_ids)) == len(fired_ids)


async def test_the_cli_names_a_schedule_it_does_not_know(settings: Settings, app: App) -> None:
    await declare(settings)
    code, _, err = await _run(settings, "schedules", "pause", "nightly")
    assert code == 1
    assert "No schedule 'nightly' is declared in topics/ or has run yet (known: " \
           f"{TICK}:beat)" in " ".join(err.split())


async def test_the_dashboard_shows_the_schedules(settings: Settings, app: App,
                                                 running: Start) -> None:
    from stream_jobs.gateway import create_app

    from .test_gateway import served

    policy = await declare(settings)
    runner = Scheduler(settings, policy, policy.schedules, client=_firings(settings, policy),
                       holder="dashboard scheduler")
    running(runner)
    await until(lambda: runner.fired >= 1, "a firing", within_s=30)
    async with served(create_app(settings)) as http:
        page = (await http.get("/")).text
    row = page.split(f'data-schedule="{TICK}:beat"', 1)[1].split("</tr>", 1)[0]
    assert "every 1s" in row
    assert "dashboard scheduler" in row
    assert "UTC" in row  # next fire and last fired, as times


async def test_trigger_of_a_schedule_declared_in_code_prints_its_fire_time(
        settings: Settings, stream_jobs_bind: Any, running: Start) -> None:
    from tests.apps.stamps import app as stamps

    await declare(settings, toml="")
    stream_jobs_bind(stamps)
    runner = stamps.scheduler(TICK)
    assert runner is not None
    task = running(runner)  # it writes the schedule's row, by which the CLI knows it

    async def has_row() -> bool:
        return bool(await read_states(settings, settings.topic_prefix))

    await until(has_row, "the schedule's row", within_s=30)
    await stopped(runner, task)

    before = datetime.now(UTC)
    code, out, err = await _run(settings, "schedules", "trigger", "stamped",
                                "--app", "tests.apps.stamps:app")
    after = datetime.now(UTC)
    assert code == 0, err
    printed = err.strip().rsplit(" triggered at ", 1)
    assert printed[0] == f"{TICK}:stamped", err
    fired = datetime.fromisoformat(printed[1])  # not "now": a time on the schedule's clock
    assert fired.tzinfo is not None
    assert before - timedelta(seconds=1) <= fired <= after
    assert fired.utcoffset() == fired.astimezone(ZoneInfo("Europe/Berlin")).utcoffset()
    # The payload function got the time that was printed.
    records = await read_topic(settings, lane_topic(settings.topic_prefix, TICK))
    bodies = {dict(r.headers)[HEADER_JOB_ID].decode(): orjson.loads(r.value or b"")
              for r in records}
    assert bodies[out.strip()] == {"fire": fired.isoformat()}
