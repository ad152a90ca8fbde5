"""Several job types in one `stream-jobs worker` process, on the real stack.

`stream-jobs worker tests.apps.pair:app` without `--type` runs both of the app's types
in one process: first in shadow mode (each type counted in its own shadow group, nothing
run), then for real, with one metrics port serving both types' series from one registry,
until SIGTERM drains both. The app (tests/apps/pair.py) writes a row per job naming its
type and process. Nothing waits by sleeping: waits poll a condition to a deadline.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.kafka.admin import admin_client
from stream_jobs.naming import lane_topic, worker_group
from stream_jobs.settings import Settings
from tests.apps.pair import TYPES
from tests.integration.cli_env import settings_env
from tests.waiting import until

from .conftest import Declare

REPO = Path(__file__).resolve().parents[2]
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
JOBS = 60  # per type


@pytest.fixture
async def db(app: App, settings: Settings) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        await conn.execute("CREATE TABLE runs (job_type text NOT NULL, job_id text NOT NULL, "
                           "pid int NOT NULL)")
        yield conn
    finally:
        await conn.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_worker(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen([str(STREAM_JOBS), "worker", *args], cwd=REPO, env=env,
                                stdout=sink, stderr=subprocess.STDOUT)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines at the terminal's width


async def committed(settings: Settings, job_type: str) -> int:
    prefix = settings.topic_prefix
    async with admin_client(settings) as admin:
        offsets = await admin.list_consumer_group_offsets(worker_group(prefix, job_type))
    lane = lane_topic(prefix, job_type)
    return sum(m.offset for tp, m in offsets.items() if tp.topic == lane and m.offset >= 0)


async def test_one_process_runs_every_type_of_the_app(
        app: App, declare: Declare, db: Any, settings: Settings, tmp_path: Path) -> None:
    for job_type in TYPES:
        await declare(job_type, partitions=2, retry_tiers=["1s"])
    async with app.client() as client:
        for job_type in TYPES:
            await client.enqueue_many([Job(job_type, {"n": i}) for i in range(JOBS)])
    env = settings_env(settings, COLUMNS="300")

    # Shadow mode counts both types in their own groups and runs nothing.
    shadow = await asyncio.create_subprocess_exec(
        STREAM_JOBS, "worker", "tests.apps.pair:app", "--shadow", "--until-idle", cwd=REPO,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(shadow.communicate(), 90)
    text = one_line(out.decode(errors="replace"))
    assert shadow.returncode == 0, text
    assert (f"stopped: pair.left: {JOBS} valid, 0 undecodable; "
            f"pair.right: {JOBS} valid, 0 undecodable") in text
    assert await db.fetchval("SELECT count(*) FROM runs") == 0

    port = free_port()
    log = tmp_path / "worker.log"
    proc = start_worker(["tests.apps.pair:app", "--metrics-port", str(port)], env, log)
    try:
        async def all_ran() -> bool:
            return int(await db.fetchval("SELECT count(*) FROM runs")) == 2 * JOBS

        await until(all_ran, f"both types' jobs ran\n{log.read_text()}", within_s=90)
        # One scrape has both types, and each series once (Prometheus refuses a family
        # declared twice).
        families = {f.name: f for f in text_string_to_metric_families(scrape(port))}
        succeeded = {s.labels["type"]: s.value for s in families["stream_jobs_jobs"].samples
                     if s.labels["outcome"] == "succeeded"}
        assert succeeded == {"pair.left": JOBS, "pair.right": JOBS}
        assert scrape(port).count("# HELP stream_jobs_jobs_total ") == 1
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = one_line(log.read_text())
    assert rc == 0, text
    assert f"stopped: pair.left: succeeded {JOBS}; pair.right: succeeded {JOBS}" in text
    rows = await db.fetch("SELECT job_type, count(DISTINCT job_id) AS n, "
                          "count(DISTINCT pid) AS pids FROM runs GROUP BY job_type")
    assert {(r["job_type"], r["n"], r["pids"]) for r in rows} == {
        ("pair.left", JOBS, 1), ("pair.right", JOBS, 1)}
    assert len({r["pid"] for r in await db.fetch("SELECT DISTINCT pid FROM runs")}) == 1
    # Each type's own group committed its lane: the drain left nothing behind.
    for job_type in TYPES:
        assert await committed(settings, job_type) == JOBS
