"""What runs now, on the real stack: jobs held in their handlers by an event show in the
reader, in `stream-jobs running` and `workers`, and `stream-jobs job ID` says "running
on"; released, they are gone; the worker stopped, no worker is live."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

import orjson

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.job_types import load_job_types
from stream_jobs.settings import Settings
from stream_jobs.tools.job_status import locate
from stream_jobs.tools.worker_reports import read_running
from tests.integration.cli_env import settings_env
from tests.waiting import until

from .conftest import Declare

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))
TYPE = "run.block"


async def _cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=ROOT, env=settings_env(settings, COLUMNS="80"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_blocked_jobs_show_as_running_until_released(app: App, declare: Declare) -> None:
    await declare(TYPE, partitions=2, retry_tiers=["1s"])
    gate = asyncio.Event()
    inside: set[str] = set()

    @app.job(TYPE, timeout=300)
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        inside.add(ctx.job_id)
        await gate.wait()

    settings = app.settings
    types = load_job_types(settings.topics_dir)
    async with app.client() as client:
        ids = [await client.enqueue(TYPE, {"n": n}, key=str(n)) for n in range(3)]
        worker = app.worker(TYPE, report_interval_s=0.5)
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: inside == set(ids), "the three jobs in their handler")

            async def all_listed() -> bool:
                view = await read_running(settings, types, job_type=TYPE)
                return {row.job.job_id for row in view.jobs} == set(ids)

            await until(all_listed, "a report listing the three jobs")
            view = await read_running(settings, types)
            assert [w.worker_id for w in view.workers] == [worker.worker_id]
            starts = [row.job.started_at_ms for row in view.jobs]
            assert starts == sorted(starts)  # longest running first
            [process] = view.processes
            assert (process.host, process.pid) == (socket.gethostname(), os.getpid())
            assert process.types == (TYPE,)
            lanes = set(types[TYPE].lane_topics(settings.topic_prefix).values())
            assert len(process.partitions) == 2
            assert {topic for topic, _ in process.partitions} <= lanes
            assert process.running_count == 3

            found = await locate(settings, types, ids[0])
            assert found.status == "running", found.summary()
            assert found.summary().startswith(
                f"Job {ids[0]} ({TYPE}) is running on {worker.worker_id} for ")

            shown, as_json, wide, procs, job, unknown = await asyncio.gather(
                _cli(settings, "running", TYPE), _cli(settings, "running", "--json"),
                _cli(settings, "running", "--wide"), _cli(settings, "workers", "--json"),
                _cli(settings, "job", ids[1]), _cli(settings, "running", "no.such.type"))
            assert shown[0] == 0, shown[2]
            for job_id in ids:
                assert job_id in shown[1]
            assert "3 jobs running" in shown[1]
            assert all(len(line) <= 80 for line in shown[1].splitlines()), shown[1]
            assert {j["job_id"] for j in orjson.loads(as_json[1])["jobs"]} == set(ids)
            assert wide[0] == 0
            assert worker.worker_id in wide[1], wide[1]
            [row] = orjson.loads(procs[1])["workers"]
            assert (row["pid"], row["types"], row["running"]) == (os.getpid(), [TYPE], 3)
            assert row["oldest"]["job_id"] in ids
            assert job[0] == 0
            assert job[1].startswith(f"running Job {ids[1]} ({TYPE}) is running on"), job[1]
            assert unknown[0] == 1
            assert unknown[2].startswith("error: Unknown job type 'no.such.type'"), unknown[2]

            gate.set()

            async def none_listed() -> bool:
                view = await read_running(settings, types, job_type=TYPE)
                return bool(view.workers) and not view.jobs

            await until(none_listed, "a report listing nothing running")
            code, out, _ = await _cli(settings, "running", TYPE)
            assert code == 0
            assert out.startswith("Nothing is running (1 live worker"), out
            assert (await locate(settings, types, ids[0])).status != "running"
        finally:
            gate.set()
            worker.request_stop()
            await asyncio.wait_for(running, 60)
    # The final report says it stopped: no worker is live.
    code, out, _ = await _cli(settings, "workers")
    assert code == 0
    assert out.startswith("No worker is live"), out
