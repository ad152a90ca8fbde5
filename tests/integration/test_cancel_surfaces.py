"""Cancel where an operator meets it: `stream-jobs cancel` (its answers and exit codes),
`POST /jobs/{id}/cancel` on the gateway (token, 404, the answers), and the dashboard's job
page with its Cancel button, all on the real stack.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import orjson
from fastapi import FastAPI
from pydantic import SecretStr

from stream_jobs.app import App
from stream_jobs.gateway import create_app
from stream_jobs.gateway.state import SESSION_COOKIE
from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env

from .conftest import Declare

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))
TOKEN = "cancel-gw-token-3d2b"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=ROOT, env=settings_env(settings, COLUMNS="200"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_cancels_a_waiting_job_and_refuses_an_unknown_one(
        app: App, declare: Declare) -> None:
    await declare("cancel.cli", partitions=1, retry_tiers=["1s"])
    async with app.client() as client:
        waiting = await client.enqueue("cancel.cli", {"n": 1})
    settings = app.settings
    code, out, err = await _cli(settings, "cancel", "cancel.cli", waiting, "--reason",
                                "ordered twice")
    assert code == 0, err
    assert out.startswith(f"cancelled Job {waiting} (cancel.cli) is cancelled")
    # Both at once: CLI starts cost seconds of CPU here.
    (again, unknown, shown) = await asyncio.gather(
        _cli(settings, "cancel", "cancel.cli", waiting, "--json"),
        _cli(settings, "cancel", "cancel.cli", "01a2-not-a-job"),
        _cli(settings, "job", waiting))
    assert again[0] == 0
    document = orjson.loads(again[1])
    assert document["answer"] == "already_cancelled"
    assert document["changed"] is False
    assert document["reason"] == "ordered twice"
    assert unknown[0] == 1
    assert unknown[2].startswith("error: No job 01a2-not-a-job was found"), unknown[2]
    assert len(unknown[2].strip().splitlines()) == 1
    assert shown[0] == 0
    assert shown[1].startswith("cancelled ")
    assert "ordered twice" in shown[1]


@asynccontextmanager
async def _served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:
        yield http


async def test_the_gateway_and_the_dashboard_cancel_a_waiting_job(app: App,
                                                                  declare: Declare) -> None:
    await declare("cancel.gw", partitions=1, retry_tiers=["1s"])
    async with app.client() as client:
        by_api = await client.enqueue("cancel.gw", {"n": 1})
        by_page = await client.enqueue("cancel.gw", {"n": 2})
    settings = app.settings.model_copy(update={"gateway_token": SecretStr(TOKEN)})
    gateway = create_app(settings, sample=False)
    async with _served(gateway) as http:
        assert (await http.post(f"/jobs/{by_api}/cancel")).status_code == 401
        missing = await http.post("/jobs/01a2-not-a-job/cancel?type=cancel.gw", headers=AUTH)
        assert missing.status_code == 404
        assert missing.json()["detail"].startswith("No job 01a2-not-a-job was found")
        done = await http.post(f"/jobs/{by_api}/cancel", headers=AUTH,
                               json={"reason": "from the API"})
        assert done.status_code == 200, done.text
        assert done.json()["answer"] == "cancelled"
        assert done.json()["changed"] is True
        assert done.json()["job_type"] == "cancel.gw"
        twice = await http.post(f"/jobs/{by_api}/cancel", headers=AUTH)
        assert twice.json()["answer"] == "already_cancelled"
        assert twice.json()["changed"] is False

        # The dashboard: signed in, the job's page offers the button; the form cancels.
        assert (await http.get(f"/ui/jobs/{by_page}")).status_code == 303  # to /login
        signed_in = await http.post("/login", data={"token": TOKEN, "next": "/"})
        assert signed_in.status_code == 303
        assert SESSION_COOKIE in signed_in.cookies
        page = await http.get(f"/ui/jobs/{by_page}")
        assert page.status_code == 200
        assert 'data-figure="status">pending<' in page.text
        assert f'href="/ui/jobs/{by_page}/cancel?type=cancel.gw"' in page.text
        confirm = await http.get(f"/ui/jobs/{by_page}/cancel?type=cancel.gw")
        assert "Yes, cancel" in confirm.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', confirm.text)
        assert csrf is not None
        posted = await http.post(f"/ui/jobs/{by_page}/cancel",
                                 data={"type": "cancel.gw", "reason": "from the page",
                                       "csrf": csrf.group(1)})
        assert posted.status_code == 303
        after = await http.get(posted.headers["location"])
        assert 'data-figure="status">cancelled<' in after.text
        assert "from the page" in after.text
        assert "Cancel…" not in after.text  # nothing left to cancel
        found = await http.get("/ui/jobs", params={"id": by_page})
        assert found.headers["location"] == f"/ui/jobs/{by_page}"
