"""Where a job waits in a delay tier, on the real stack and on every surface that says it:
a job enqueued with a delay that never failed is `scheduled` (its first attempt waits
out the delay), one that failed and waits for its next attempt is `retrying`.

The surfaces: `locate_job`, `client.status`, `stream-jobs job --json`, the gateway's
`GET /jobs/{id}` and the operator's cancel (a scheduled job is one still waiting).
Nothing waits by sleeping: every wait polls a condition to a deadline.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
from pydantic import SecretStr

from stream_jobs.app import App
from stream_jobs.cancels.rules import CancelAnswer
from stream_jobs.context import JobContext
from stream_jobs.gateway import create_app
from stream_jobs.job_types import load_job_types
from stream_jobs.lookup import locate_job
from stream_jobs.settings import Settings
from stream_jobs.tools.cancel import cancel_job
from tests.integration.cli_env import settings_env
from tests.waiting import until

from .conftest import Declare

STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
TYPE = "status.delayed"
TOKEN = "status-test-token-3b9e"


async def cli_job(settings: Settings, job_id: str) -> dict[str, object]:
    proc = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), "job", job_id, "--json", env=settings_env(settings),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    found: dict[str, object] = orjson.loads(out)
    return found


async def gateway_job(settings: Settings, job_id: str) -> dict[str, object]:
    app = create_app(settings.model_copy(update={"gateway_token": SecretStr(TOKEN)}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:
        answer = await http.get(f"/jobs/{job_id}", params={"type": TYPE},
                                headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.text
    found: dict[str, object] = answer.json()
    return found


async def test_a_delayed_job_is_scheduled_and_a_failed_one_retrying_everywhere(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare(TYPE, partitions=2, retry_tiers=["1m"], max_attempts=3)
    types = load_job_types(settings.topics_dir)

    @app.job(TYPE)
    async def handle(job: dict[str, str], ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails")

    async with app.client() as client:
        later = await client.enqueue(TYPE, {"kind": "later"}, delay=600)
        flaky = await client.enqueue(TYPE, {"kind": "flaky"})

        # Before any worker: the delayed job waits in tier 1m for its first attempt.
        scheduled = await client.status(later)
        assert scheduled.status == "scheduled", scheduled.summary()
        assert scheduled.attempt == 1
        assert "for its first attempt" in scheduled.summary()
        assert "enqueued with a delay" in scheduled.summary()

        # A worker runs the other job, whose first attempt fails: it waits in the same
        # tier for attempt 2, and the relay holds the delayed one (or hops it) meanwhile.
        worker = app.worker(TYPE)
        running = asyncio.create_task(worker.run())
        try:
            async def retried() -> bool:
                if running.done():
                    await running  # surfaces the worker's error
                return (await client.status(flaky)).status == "retrying"

            await until(retried, "the failed job waits in its tier", within_s=60)
            assert (await client.status(later)).status == "scheduled"
        finally:
            worker.request_stop()
            await running

    retrying = await locate_job(settings, types, flaky)
    assert (retrying.status, retrying.attempt) == ("retrying", 2)
    assert retrying.last is not None
    assert retrying.last.failure is not None
    assert "for attempt 2" in retrying.summary()
    assert (await locate_job(settings, types, later)).status == "scheduled"

    told, flaky_told = await asyncio.gather(cli_job(settings, later), cli_job(settings, flaky))
    assert (told["status"], told["attempt"]) == ("scheduled", 1)
    assert flaky_told["status"] == "retrying"
    served = await gateway_job(settings, later)
    assert served["status"] == "scheduled"
    assert "for its first attempt" in str(served["summary"])
    # An operator's cancel treats it as the waiting job it is.
    cancelled = await cancel_job(settings, types, later, reason="not needed")
    assert cancelled.answer is CancelAnswer.CANCELLED
