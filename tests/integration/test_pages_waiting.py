"""The dashboard's lists of jobs by state (`/ui/types/T/pending|scheduled|retrying|dead`)
in headless Chromium, on one type holding each kind: jobs waiting in a lane with no
worker, delayed enqueues, retries waiting in a 10-minute tier (a handler failing once)
and a dead job. Each tab lists exactly its jobs, paging follows "Next page", a page fits
at 1280 and 390 px, and without a session the pages send the browser to /login. Then
`stream-jobs waiting` prints the same rows, within 80 columns."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.jobs import Job
from stream_jobs.settings import Settings
from tests.waiting import until

from .browser import chromium, fits, follow, needs_chromium, new_page, sign_in
from .conftest import Declare
from .served_gateway import serve_env, serving

TOKEN = "waiting-pages-token-41c2"
TYPE = "wait.ui"
PENDING = 60


async def _make_each_kind(settings: Settings) -> dict[str, list[str]]:
    """Retrying and dead jobs through a worker, then (worker stopped) delayed and pending."""
    app = App(settings)

    @app.job(TYPE, concurrency=4)
    async def flaky(job: dict[str, str], ctx: JobContext) -> None:
        if job["fail"] == "always":
            raise PermanentError("the payload names no account")
        if job["fail"] == "once" and ctx.attempt == 1:
            raise ConnectionError("the backend hung up")

    async with app.client() as client:
        retrying = await client.enqueue_many(Job(TYPE, {"fail": "once"}) for _ in range(3))
        dead = [await client.enqueue(TYPE, {"fail": "always"})]
        worker = app.worker(TYPE)
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: worker.outcomes["retried"] == 3
                        and worker.outcomes["dead_lettered"] == 1,
                        "3 jobs retried and 1 dead-lettered", within_s=60)
        finally:
            worker.request_stop()
            await running
        scheduled = await client.enqueue_many(Job(TYPE, {"fail": "no"}, delay=3600)
                                              for _ in range(4))
        pending = await client.enqueue_many(Job(TYPE, {"fail": "no"}) for _ in range(PENDING))
    return {"pending": pending, "scheduled": scheduled, "retrying": retrying, "dead": dead}


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr data-job-id="([^"]*)"', html)


@needs_chromium
async def test_each_tab_lists_its_jobs(settings: Settings, declare: Declare, app: App,
                                       tmp_path: Path) -> None:
    await declare(TYPE, partitions=2, retry_tiers=["10m"], max_attempts=3)
    made = await _make_each_kind(settings)
    env = serve_env(settings, settings.topics_dir, STREAM_JOBS_GATEWAY_TOKEN=TOKEN)
    with serving(env, tmp_path / "serve.log") as (port, _):
        base = f"http://127.0.0.1:{port}"
        # Without a session: to /login, and back here after signing in.
        async with httpx.AsyncClient(base_url=base) as http:
            for state in made:
                answer = await http.get(f"/ui/types/{TYPE}/{state}")
                assert answer.status_code == 303
                assert answer.headers["location"].startswith("/login?next=")
        async with chromium() as browser:
            page = await new_page(browser)
            await sign_in(page, base, TOKEN, then=f"/ui/types/{TYPE}/pending?size=25")
            assert page.url.endswith(f"/ui/types/{TYPE}/pending?size=25")

            # Waiting in the lanes: 60 jobs, 25 a page, by following "Next page".
            assert await page.locator('[data-figure="total"]').inner_text() == str(PENDING)
            await fits(page, "dashboard-pending")
            listed = _ids(await page.content())
            pages = 1
            while await page.locator("[data-next]").count():
                await follow(page, "[data-next]")
                assert await page.locator("[data-first]").count() == 1
                listed += _ids(await page.content())
                pages += 1
            assert pages == 3
            assert sorted(listed) == sorted(made["pending"])  # each once, none left out

            for state in ("scheduled", "retrying", "dead"):
                await follow(page, f'nav.tabs a[href="/ui/types/{TYPE}/{state}"]')
                assert sorted(_ids(await page.content())) == sorted(made[state]), state
                assert await page.locator("[data-next]").count() == 0
                # Named in full: the manual's test finds each page's pictures by these.
                if state == "scheduled":
                    await fits(page, "dashboard-scheduled")
                elif state == "retrying":
                    await fits(page, "dashboard-retrying")
                else:
                    await fits(page, "dashboard-dead")
            content = await page.content()
            assert "the payload names no account" not in content  # the dead list's reason:
            assert "permanent" in content
            await follow(page, f'nav.tabs a[href="/ui/types/{TYPE}/retrying"]')
            assert "ConnectionError: the backend hung up" in await page.content()

            # A job ID leads to the job's page.
            await follow(page, f'tr[data-job-id="{made["retrying"][0]}"] a')
            assert made["retrying"][0] in await page.inner_text("h1")

            # A damaged cursor or size is a clear 400, never a server error.
            for query in ("after=not-a-cursor", "size=9999", "size=ten"):
                answer = await page.goto(f"{base}/ui/types/{TYPE}/pending?{query}")
                assert answer is not None
                assert answer.status == 400, query
                assert "No such page" in await page.content()

    # The shell: the same rows, within 80 columns, and the next page's cursor.
    await asyncio.to_thread(_the_shell_shows_them, env, made)
    assert os.environ.get("STREAM_JOBS_TOPIC_PREFIX") != settings.topic_prefix


def _the_shell_shows_them(env: dict[str, str], made: dict[str, list[str]]) -> None:
    shell = {**env, "COLUMNS": "80"}
    stream_jobs = str(Path(sys.executable).with_name("stream-jobs"))
    out = subprocess.run([stream_jobs, "waiting", TYPE, "--limit", "40"], env=shell,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    *shown, cursor = out.splitlines()  # the cursor last, on a line of its own
    assert all(len(line) <= 80 for line in shown), out
    assert shown[-1].endswith("--after")
    first = [i for i in made["pending"] if i in out]
    assert len(first) == 40, out
    rest = json.loads(subprocess.run(
        [stream_jobs, "waiting", TYPE, "--after", cursor, "--json"], env=shell,
        capture_output=True, text=True, check=True, timeout=120).stdout)
    assert sorted(first + [row["job_id"] for row in rest["rows"]]) == sorted(made["pending"])
    assert rest["first"] == 41
    assert rest["next_cursor"] is None
    wide = subprocess.run([stream_jobs, "waiting", TYPE, "--state", "retrying", "--wide"],
                          env={**shell, "COLUMNS": "160"}, capture_output=True, text=True,
                          check=True, timeout=120).stdout
    assert "the backend hung up" in wide
    bad = subprocess.run([stream_jobs, "waiting", TYPE, "--after", "bogus"], env=shell,
                         capture_output=True, text=True, check=False, timeout=120)
    assert bad.returncode == 1
    assert "first page" in bad.stderr, bad.stderr
