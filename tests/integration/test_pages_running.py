"""`/ui/running`, `/ui/types/{type}/running` and `/ui/workers` in headless Chromium while
jobs of two types are held in their handlers by an event: the job rows and the worker
process shown, each page at 1280 and 390 px, and the job's page saying running; the
running pages refuse without a session, `GET /jobs/{id}` says running; with no worker
live (before, and after they stopped), the pages say so."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.tools.worker_reports import read_running
from tests.waiting import until

from .browser import chromium, fits, needs_chromium, new_page, sign_in
from .conftest import Declare
from .served_gateway import serve_env, serving

if TYPE_CHECKING:
    from playwright.async_api import Page

TOKEN = "running-pages-token-5c1e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HELD, OTHER = "pages.held", "pages.other"


@needs_chromium
async def test_the_running_and_workers_pages_show_held_jobs(
        app: App, declare: Declare, tmp_path: Path) -> None:
    await declare(HELD, partitions=2, retry_tiers=["1s"])
    await declare(OTHER, partitions=1, retry_tiers=["1s"])
    settings = app.settings
    types = load_job_types(settings.topics_dir)
    env = serve_env(settings, settings.topics_dir, STREAM_JOBS_GATEWAY_TOKEN=TOKEN)
    with serving(env, tmp_path / "serve.log") as (port, _):
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for path in ("/ui/running", f"/ui/types/{HELD}/running"):
                refused = await http.get(path)
                assert refused.status_code == 303
                assert refused.headers["location"].startswith("/login?next=")
            idle = await http.get("/ui/workers")  # an aggregate: open like /
            assert idle.status_code == 200
            assert 'data-figure="no-workers"' in idle.text

            async with chromium() as browser:
                page = await new_page(browser)
                await sign_in(page, base, TOKEN, "/ui/running")
                assert page.url.endswith("/ui/running")
                assert await page.locator('[data-figure="no-workers"]').count() == 1
                missing = await page.goto(f"{base}/ui/types/no.such/running")
                assert missing is not None
                assert missing.status == 404
                await _while_held(app, http, page, base, types)
                await page.goto(f"{base}/ui/types/{HELD}/running")  # the workers stopped
                assert await page.locator('[data-figure="no-workers"]').count() == 1


async def _while_held(app: App, http: httpx.AsyncClient, page: Page, base: str,
                      types: dict[str, JobTypePolicy]) -> None:
    """Jobs of both types held in their handlers: the JSON route and the pages."""
    gate = asyncio.Event()
    inside: set[str] = set()

    async def hold(job: dict[str, Any], ctx: JobContext) -> None:
        inside.add(ctx.job_id)
        await gate.wait()

    app.job(HELD, timeout=300)(hold)
    app.job(OTHER, timeout=300)(hold)
    async with app.client() as client:
        held = [await client.enqueue(HELD, {"n": n}, key=str(n)) for n in range(3)]
        other = await client.enqueue(OTHER, {"n": 9})
    workers = [app.worker(name, report_interval_s=0.5) for name in (HELD, OTHER)]
    runs = [asyncio.create_task(w.run()) for w in workers]
    try:
        await until(lambda: inside == {*held, other}, "four jobs in their handlers")

        async def listed() -> bool:
            view = await read_running(app.settings, types)
            return {row.job.job_id for row in view.jobs} == {*held, other}

        await until(listed, "the reports listing the four jobs")
        answer = await http.get(f"/jobs/{held[0]}", headers=AUTH)
        assert answer.status_code == 200, answer.text
        document = orjson.loads(answer.content)
        assert document["status"] == "running"
        assert " is running on " in document["summary"]
        await _browse(page, base, held, other)
    finally:
        gate.set()
        for w in workers:
            w.request_stop()
        await asyncio.wait_for(asyncio.gather(*runs), 60)


async def _browse(page: Page, base: str, held: list[str], other: str) -> None:
    await page.goto(f"{base}/ui/running")
    rows = await page.locator("tr[data-job-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.jobId)")
    assert set(rows) == {*held, other}
    assert await page.locator('header nav a[aria-current="page"]').inner_text() == "Running"
    assert await page.locator('[data-figure="running"]').inner_text() == "4"
    assert await page.locator('[data-figure="freshness"]').count() == 1
    link = page.locator(f'tr[data-job-id="{held[0]}"] a').first
    assert await link.get_attribute("href") == f"/ui/jobs/{held[0]}?type={HELD}"
    await fits(page, "dashboard-running")
    await link.click()
    await page.wait_for_load_state()
    assert await page.locator('[data-figure="status"]').inner_text() == "running"

    await page.goto(f"{base}/ui/types/{HELD}/running")
    rows = await page.locator("tr[data-job-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.jobId)")
    assert set(rows) == set(held)
    assert await page.locator('.tabs a[aria-current="page"]').inner_text() == "Running"
    await fits(page, "dashboard-running-type")

    await page.goto(f"{base}/ui/workers")
    row = page.locator("tr[data-worker]")
    assert await row.count() == 1  # one process runs both types
    assert await row.get_attribute("data-pid") == str(os.getpid())
    assert HELD in await row.inner_text()
    assert OTHER in await row.inner_text()
    assert await page.locator('[data-figure="running"]').inner_text() == "4"
    await fits(page, "dashboard-workers")
