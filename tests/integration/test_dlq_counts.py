"""Honest DLQ counts on the real stack: a worker killed -9 mid-retry leaves some jobs with
more than one dead letter, and what an operator reads (`dlq list`, `stats`, the gateway's
`stream_jobs_dlq_jobs` and its dashboard) is the number of jobs that died, the letters
beside it.

The worker runs as a `stream-jobs worker tests.apps.doomed:app` subprocess; one of its
jobs hangs on its first attempt (tests/apps/doomed.py), so the worker's committed offset
stays behind it while the others retry and die. Killed there, the next worker runs them
all again and each dies again: a second letter (or third) for the same job ID. Half the
jobs die at once, the other half retry through a 10 s tier: the kill lands while they
wait there, mid-retry.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from pydantic import SecretStr

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.gateway import create_app
from stream_jobs.naming import dlq_topic
from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env
from tests.waiting import until

from .conftest import Declare
from .test_gateway import metric, served
from .test_worker_processes import WorkerProcess
from .topic_reader import read_topic

DOOMED = "doomed.job"
JOBS = 60
REPO = Path(__file__).resolve().parents[2]
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
TOKEN = "counts-test-token-3a9e"


def _start_worker(settings: Settings, log: Path, *, hang: bool,
                  until_idle: bool = False) -> WorkerProcess:
    args = [str(STREAM_JOBS), "worker", "tests.apps.doomed:app", "--type", DOOMED]
    if until_idle:
        args.append("--until-idle")
    env = settings_env(settings, DOOMED_HANG="1" if hang else "0")
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    return WorkerProcess(log.stem, proc, log)


async def _letters_by_job(settings: Settings) -> dict[str, int]:
    """Letters per job ID, read straight from the DLQ topic (the test's own count)."""
    found: dict[str, int] = {}
    for record in await read_topic(settings, dlq_topic(settings.topic_prefix, DOOMED)):
        job_id = dict(record.headers)["sj-job-id"].decode()
        found[job_id] = found.get(job_id, 0) + 1
    return found


async def _cli_json(settings: Settings, *args: str) -> dict[str, object]:
    proc = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), *args, "--json", env=settings_env(settings),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    document: dict[str, object] = json.loads(out)
    return document


async def test_after_a_worker_is_killed_mid_retry_the_operator_counts_the_jobs_that_died(
        app: App, declare: Declare, settings: Settings, tmp_path: Path) -> None:
    await declare(DOOMED, partitions=1, retry_tiers=["10s"], max_attempts=2)
    async with app.client() as client:
        # The hanging job first: the partition's commits stop at its offset.
        hanging = await client.enqueue(DOOMED, {"n": 0, "hang": True})
        ids = [hanging, *await client.enqueue_many(
            [Job(DOOMED, {"n": n}) for n in range(1, JOBS)])]
    assert len(set(ids)) == JOBS

    # The even jobs die at once, the odd ones wait 10 s in the tier: killed between.
    permanent = len(range(2, JOBS, 2))
    first = _start_worker(settings, tmp_path / "first.log", hang=True)
    try:
        async def dying() -> bool:
            return sum((await _letters_by_job(settings)).values()) >= permanent
        await until(dying, f"{permanent} jobs dead-lettered by the first worker", within_s=90)
    finally:
        first.signal(signal.SIGKILL)
    assert await first.exited(10) == -signal.SIGKILL, first.tail()
    at_kill = await _letters_by_job(settings)
    assert len(at_kill) < JOBS - 1, "every job died before the kill: nothing was mid-retry"

    began = time.monotonic()
    second = _start_worker(settings, tmp_path / "second.log", hang=False, until_idle=True)
    assert await second.exited(180) == 0, second.tail()
    letters = await _letters_by_job(settings)
    total = sum(letters.values())
    # Every job died, some more than once: the DLQ holds more letters than jobs.
    assert sorted(letters) == sorted(ids)
    assert total > JOBS, letters
    print(f"\n{JOBS} jobs died as {total} letters ({total - JOBS} repeats; "
          f"{len(at_kill)} jobs dead at the kill, rerun in {time.monotonic() - began:.1f} s)")

    listed, stats = await asyncio.gather(_cli_json(settings, "dlq", "list", DOOMED),
                                         _cli_json(settings, "stats", DOOMED))
    assert (listed["jobs"], listed["letters"], listed["repeats"]) == (JOBS, total, total - JOBS)
    dlq = stats["types"][DOOMED]["dlq"]  # type: ignore[index]
    assert (dlq["jobs"], dlq["letters"], dlq["repeats"]) == (JOBS, total, total - JOBS)

    gateway = create_app(settings.model_copy(update={
        "gateway_token": SecretStr(TOKEN), "gateway_sample_interval_s": 0.3}))
    async with served(gateway) as http:
        async def sampled() -> bool:
            text = (await http.get("/metrics")).text
            return metric(text, "stream_jobs_dlq_jobs", type=DOOMED) is not None
        await until(sampled, "the gateway to sample the DLQ")
        text = (await http.get("/metrics")).text
        assert metric(text, "stream_jobs_dlq_jobs", type=DOOMED) == JOBS
        assert metric(text, "stream_jobs_dlq_depth", type=DOOMED) == total
        page = (await http.get("/")).text
        assert _figure(page, "dlq") == JOBS
        assert _figure(page, "dlq-letters") == total
        dlq_page = await _signed_in_page(http, f"/ui/dlq/{DOOMED}")
        assert (_figure(dlq_page, "jobs"), _figure(dlq_page, "letters"),
                _figure(dlq_page, "repeats")) == (JOBS, total, total - JOBS)


def _figure(page: str, name: str) -> int:
    found = re.search(rf'data-figure="{re.escape(name)}"[^>]*>([\d,]+)<', page)
    assert found is not None, f"no figure {name!r} on the page"
    return int(found.group(1).replace(",", ""))


async def _signed_in_page(http: httpx.AsyncClient, path: str) -> str:
    await http.post("/login", data={"token": TOKEN}, headers={"Origin": "http://localhost"})
    answer = await http.get(path)
    assert answer.status_code == 200, answer.text[:300]
    return answer.text
