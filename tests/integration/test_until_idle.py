"""`--until-idle` with several types: the worker returns only once no type of the app has
a job in a lane, a delay tier, the outbox or a handler.

The jobs here cross types the way workflows do (tests/apps/flows.py): a batch's callback
is another type than its members, and a chain's steps are three types, each written
through the outbox by the transaction that finishes the job before it. A worker that
decides "idle" per type, on that type's lanes alone, returns before the callback or the
next step exists. In-process, the host is made as `stream-jobs worker APP` makes it
(`WorkerHost` with `process_services`); then the real command runs, with one process and
with `--processes 2`, where a step written by one child may be another child's to run.
Nothing waits by sleeping: the worker's own return is what the tests wait for.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.outbox.depth import read_depth
from stream_jobs.runtime.host import WorkerHost, process_services
from stream_jobs.settings import Settings
from stream_jobs.testing.plugin import Bind
from stream_jobs.workflows import step_job_id
from stream_jobs.workflows.members import callback_job_id
from tests.apps import flows
from tests.apps.flows import CALLBACK, MEMBER, STEPS, TYPES
from tests.integration.cli_env import settings_env
from tests.integration.database import fetch_rows

from .conftest import Declare

REPO = Path(__file__).resolve().parents[2]
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
MEMBERS = 6
# The failed first attempts wait this long: longer than a type takes to join its groups
# and find its lanes empty, so a per-type idle check decides before the callback exists.
TIER = "5s"
# Bounds for a hang (the bug's opposite), far above what a run takes.
RUN_LIMIT_S = 120.0


@pytest.fixture
async def app(stream_jobs_bind: Bind, declare: Declare) -> App:
    bound = stream_jobs_bind(flows.app, flows.RUNS_DDL)
    for job_type in TYPES:
        await declare(job_type, partitions=2, retry_tiers=[TIER], max_attempts=3)
    return bound


async def start_batch(app: App) -> str:
    """A batch whose callback is another type than its members."""
    async with app.client() as client:
        return await client.batch([Job(MEMBER, {"n": i}) for i in range(MEMBERS)],
                                  on_complete=Job(CALLBACK, {"album": "holidays"}))


async def start_chain(app: App) -> str:
    """A chain across three types."""
    async with app.client() as client:
        return await client.chain(*(Job(t, {"add": 10 ** i}) for i, t in enumerate(STEPS)))


async def runs(settings: Settings) -> dict[str, list[tuple[str, str | None]]]:
    """The `runs` rows by type: (job ID, what the job saw before it)."""
    found: dict[str, list[tuple[str, str | None]]] = {}
    for row in await fetch_rows(settings, "SELECT job_type, job_id, parent FROM runs"):
        found.setdefault(row["job_type"], []).append((row["job_id"], row["parent"]))
    return found


async def assert_batch_ran(settings: Settings, batch_id: str) -> None:
    """Every member ran once, then the callback, with the batch's counts."""
    ran = await runs(settings)
    assert len(ran.get(MEMBER, [])) == MEMBERS, ran
    assert ran.get(CALLBACK) == [(callback_job_id(batch_id, "on_complete"), str(MEMBERS))], ran
    assert (await read_depth(settings)).depth == 0


async def assert_chain_ran(settings: Settings, chain_id: str) -> None:
    """Each step ran once, with the sum of the ones before it as its parent's result."""
    ran = await runs(settings)
    assert [ran.get(t) for t in STEPS] == [
        [(step_job_id(chain_id, 0), None)], [(step_job_id(chain_id, 1), "1")],
        [(step_job_id(chain_id, 2), "11")]], ran
    assert (await read_depth(settings)).depth == 0


def nonzero(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {t: {k: n for k, n in found.items() if n} for t, found in counts.items()}


async def run_host(app: App) -> WorkerHost:
    """`stream-jobs worker APP --until-idle` in this process: every type of the app in
    one host, with the process's services (its outbox relay)."""
    workers = [app.worker(t) for t in TYPES]
    host = WorkerHost(workers, until_idle=True,
                      services=process_services(app.settings, workers))
    await asyncio.wait_for(host.run(), RUN_LIMIT_S)
    return host


async def test_a_batch_callback_of_another_type_runs_before_the_host_returns(
        app: App, settings: Settings) -> None:
    batch_id = await start_batch(app)
    host = await run_host(app)
    await assert_batch_ran(settings, batch_id)
    assert nonzero(host.counts()) == {
        MEMBER: {"succeeded": MEMBERS, "retried": 1}, CALLBACK: {"succeeded": 1},
        **{t: {} for t in STEPS}}


async def test_a_chain_across_three_types_runs_to_its_end_before_the_host_returns(
        app: App, settings: Settings) -> None:
    chain_id = await start_chain(app)
    host = await run_host(app)
    await assert_chain_ran(settings, chain_id)
    assert nonzero(host.counts()) == {
        MEMBER: {}, CALLBACK: {}, STEPS[0]: {"succeeded": 1},
        STEPS[1]: {"succeeded": 1, "retried": 1}, STEPS[2]: {"succeeded": 1}}


async def run_command(settings: Settings, *options: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        STREAM_JOBS, "worker", "tests.apps.flows:app", "--until-idle", *options, cwd=REPO,
        env=settings_env(settings, COLUMNS="300"), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), RUN_LIMIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


async def test_the_worker_command_returns_after_every_callback_and_step(
        app: App, settings: Settings) -> None:
    batch_id, chain_id = await start_batch(app), await start_chain(app)
    text = await run_command(settings)
    await assert_batch_ran(settings, batch_id)
    await assert_chain_ran(settings, chain_id)
    assert (f"stopped: album.photo: retried 1, succeeded {MEMBERS}; album.report: "
            "succeeded 1; video.fetch: succeeded 1; video.publish: succeeded 1; "
            "video.transcode: retried 1, succeeded 1") in " ".join(text.split()), text


async def test_with_two_processes_every_child_agrees_before_the_command_returns(
        app: App, settings: Settings) -> None:
    batch_id, chain_id = await start_batch(app), await start_chain(app)
    text = " ".join((await run_command(settings, "--processes", "2")).split())
    await assert_batch_ran(settings, batch_id)
    await assert_chain_ran(settings, chain_id)
    assert "every worker process is idle" in text, text
    assert (f"stopped: album.photo: retried 1, succeeded {MEMBERS}; album.report: "
            "succeeded 1; video.fetch: succeeded 1; video.publish: succeeded 1; "
            "video.transcode: retried 1, succeeded 1") in text, text
