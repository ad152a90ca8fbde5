"""Where users see results and batches: `client.status`, `stream-jobs job ID`, `stream-jobs
batch ID`, `GET /jobs/{id}`, `GET /batches/{id}` and the dashboard's open batches."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import orjson
from pydantic import SecretStr

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.gateway import create_app
from stream_jobs.settings import Settings

from .conftest import Declare

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))
TOKEN = "results-surface-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def cli(settings: Settings, *args: str) -> str:
    env = {**os.environ, "COLUMNS": "200", "STREAM_JOBS_DATABASE_URL": settings.database_url,
           "STREAM_JOBS_DATABASE_SCHEMA": settings.database_schema,
           "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
           "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir)}
    proc = await asyncio.create_subprocess_exec(CLI, *args, cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def test_results_and_batches_where_users_look(app: App, declare: Declare,
                                                    settings: Settings) -> None:
    await declare("report.build", partitions=1)

    @app.job("report.build", keep_result="1d")
    async def build(job: dict[str, int], ctx: JobContext) -> dict[str, int]:
        return {"pages": job["n"] * 2}

    async with app.client() as client:
        job_id = await client.enqueue("report.build", {"n": 21})
        await app.worker("report.build").run(until_idle=True)
        status = await client.status(job_id)
        batch_id = await client.batch([Job("report.build", {"n": 1}) for _ in range(3)])
    assert status.status == "done"
    assert status.result is not None
    assert status.result.value() == {"pages": 42}
    assert 'Its result (kept until ' in status.summary()

    looked_up = await cli(settings, "job", job_id)
    assert 'Its result (kept until ' in looked_up
    assert '{"pages": 42}' in looked_up
    progress = orjson.loads(await cli(settings, "batch", batch_id, "--json"))
    assert (progress["kind"], progress["pending"], progress["state"]) == ("batch", 3, "running")
    assert batch_id in await cli(settings, "batch", "--open")

    gateway = create_app(settings.model_copy(update={"gateway_token": SecretStr(TOKEN)}),
                         sample=False)
    async with gateway.router.lifespan_context(gateway), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gateway), base_url="http://localhost") as http:
        job = (await http.get(f"/jobs/{job_id}", headers=AUTH)).json()
        assert job["status"] == "done"
        assert job["result"]["result"] == {"pages": 42}
        found = await http.get(f"/batches/{batch_id}", headers=AUTH)
        assert found.status_code == 200
        assert found.json()["total"] == 3
        missing = await http.get("/batches/no-such-batch", headers=AUTH)
        assert missing.status_code == 404
        assert "No batch or chain has the ID" in missing.json()["detail"]
        assert (await http.get(f"/batches/{batch_id}")).status_code == 401
        page = (await http.get("/")).text
        assert f'data-batch="{batch_id}"' in page
