"""The job page and the key search in headless Chromium, on the real stack: a job that
failed twice and then succeeded shows its three attempts (the worker and the error of
each failure, the tier waited in between) and its payload with the type's `redact`
fields masked, and its tenant; a job waiting an hour for its retry is retried now through the button
(refused without a session, unchanged by a post without the CSRF token); a dead letter
is requeued through the button; and the jobs of a key are listed, each linked to its page.
Each page is checked at 1280 and 390 px (`fits`), with screenshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import uvicorn
from pydantic import SecretStr

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.gateway import create_app
from stream_jobs.lookup import locate_job
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from tests.waiting import until

from .browser import chromium, fits, needs_chromium, new_page, sign_in
from .conftest import Declare
from .served_gateway import free_port

TOKEN = "job-page-token-4c1d"
POLL_S = 0.1
SECRET_CARD, SECRET_SSN = "4111-1111-1111-1111", "078-05-1120"


@contextlib.contextmanager
def serving(settings: Settings) -> Iterator[str]:
    """The gateway on `settings` (its types as declared now), on a thread; its URL."""
    gateway_settings = settings.model_copy(update={"gateway_token": SecretStr(TOKEN)})
    server = uvicorn.Server(uvicorn.Config(create_app(gateway_settings), host="127.0.0.1",
                                           port=free_port(), log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("the gateway did not start")
            time.sleep(POLL_S)  # a poll interval, not a wait for an outcome
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


async def _declared(app: App, declare: Declare) -> tuple[list[int], list[int], list[int]]:
    """Three types and their handlers; the attempts each ran."""
    await declare("page.flaky", partitions=1, retry_tiers=["1s"], max_attempts=4,
                  redact=["card_number", "customer.ssn"])
    await declare("page.later", partitions=1, retry_tiers=["1h"], max_attempts=3)
    await declare("page.dead", partitions=1, retry_tiers=["1s"], max_attempts=1)
    flaky: list[int] = []
    later: list[int] = []
    dead: list[int] = []

    @app.job("page.flaky")
    async def run_flaky(job: dict[str, Any], ctx: JobContext) -> None:
        flaky.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ValueError(f"flaky attempt {ctx.attempt}")
        async with ctx.once():  # its dedup row: the page can say which attempt committed
            pass

    @app.job("page.later")
    async def run_later(job: dict[str, Any], ctx: JobContext) -> None:
        later.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("not yet")

    @app.job("page.dead")
    async def run_dead(job: dict[str, Any], ctx: JobContext) -> None:
        dead.append(ctx.attempt)
        if len(dead) == 1:
            raise RuntimeError("dies the first time")

    return flaky, later, dead


async def _is(app: App, job_id: str, job_type: str, status: str) -> bool:
    found = await locate_job(app.settings, app.job_types(), job_id, job_type=job_type)
    return found.status == status


@needs_chromium
async def test_the_job_page_and_its_buttons(app: App, declare: Declare) -> None:
    flaky, later, dead = await _declared(app, declare)
    workers: list[Worker] = [app.worker(t) for t in ("page.flaky", "page.later", "page.dead")]
    running = [asyncio.create_task(w.run()) for w in workers]
    try:
        async with app.client() as client:
            flaky_id = await client.enqueue("page.flaky", {
                "card_number": SECRET_CARD, "amount": 12,
                "customer": {"ssn": SECRET_SSN, "name": "Ada"}}, key="cust-42", tenant="acme")
            later_id = await client.enqueue("page.later", {})
            dead_id = await client.enqueue("page.dead", {})
        await until(lambda: _is(app, flaky_id, "page.flaky", "done"),
                    "the flaky job to fail twice and succeed", 60)
        assert flaky == [1, 2, 3]
        await until(lambda: _is(app, later_id, "page.later", "retrying"),
                    "the later job to wait in tier 1h", 60)
        await until(lambda: _is(app, dead_id, "page.dead", "dead_lettered"),
                    "the dead job to be dead-lettered", 60)
        with serving(app.settings) as url:
            await _json_payload(url, flaky_id)
            async with chromium() as browser:
                await _job_page(browser, url, flaky_id, workers[0].worker_id)
                await _retry_now(browser, url, later_id, later, workers[1])
                await _requeue(browser, url, dead_id, dead)
                await _key_search(browser, url, flaky_id)
    finally:
        for worker in workers:
            worker.request_stop()
        await asyncio.wait_for(asyncio.gather(*running), 60)


async def _json_payload(url: str, job_id: str) -> None:
    """`GET /jobs/{id}` shows the payload, masked, and only with the bearer token."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        refused = await http.get(f"/jobs/{job_id}", params={"type": "page.flaky"})
        assert refused.status_code == 401
        found = await http.get(f"/jobs/{job_id}", params={"type": "page.flaky",
                                                          "records": "true"},
                               headers={"Authorization": f"Bearer {TOKEN}"})
    assert found.status_code == 200, found.text
    payload = found.json()["payload"]
    assert SECRET_CARD not in payload
    assert SECRET_SSN not in payload
    assert payload.count("•••") == 2
    location = str(found.json()["location"])  # the lookup's records carry no payload
    assert SECRET_CARD not in location
    assert SECRET_SSN not in location


async def _job_page(browser: Any, url: str, job_id: str, worker_id: str) -> None:
    page = await new_page(browser)
    response = await page.goto(f"{url}/ui/jobs/{quote(job_id)}")
    assert response is not None
    assert "/login" in page.url  # a job's page needs a session
    await sign_in(page, url, TOKEN, f"/ui/jobs/{quote(job_id)}")
    assert await page.locator('[data-figure="status"]').inner_text() == "done"
    rows = page.locator("tr[data-attempt]")
    assert await rows.count() == 3
    for attempt in (1, 2):
        row = page.locator(f'tr[data-attempt="{attempt}"]')
        assert await row.locator('[data-figure="worker"]').inner_text() == worker_id
        error = await row.locator('[data-figure="error"]').inner_text()
        assert error == f"ValueError: flaky attempt {attempt}"
        assert "failed, retried" in await row.locator('[data-figure="outcome"]').inner_text()
    last = page.locator('tr[data-attempt="3"]')
    assert "succeeded" in await last.locator('[data-figure="outcome"]').inner_text()
    assert await last.locator('[data-figure="worker"]').inner_text() == "not recorded"
    assert await page.locator("tr[data-wait]").count() == 2
    assert await page.locator('tr[data-wait="2"] [data-figure="tier"]').inner_text() == "1s"
    assert await page.locator('[data-figure="tenant"]').inner_text() == "acme"
    payload = await page.locator('[data-figure="payload"]').inner_text()
    assert SECRET_CARD not in payload
    assert SECRET_SSN not in payload
    assert payload.count("•••") == 2
    assert '"name": "Ada"' in payload
    assert await page.locator('[data-action="retry-now"]').count() == 0
    await fits(page, "dashboard-job")
    await page.close()


async def _retry_now(browser: Any, url: str, job_id: str, attempts: list[int],
                     worker: Worker) -> None:
    action = f"{url}/ui/jobs/{quote(job_id)}/retry-now"
    stranger = await new_page(browser)  # its own context: no session
    refused = await stranger.request.post(action, form={"type": "page.later"},
                                          max_redirects=0)
    assert refused.status == 303
    assert refused.headers["location"].startswith("/login")
    await stranger.close()

    page = await new_page(browser)
    await sign_in(page, url, TOKEN, f"/ui/jobs/{quote(job_id)}")
    assert await page.locator('[data-figure="status"]').inner_text() == "retrying"
    assert await page.locator('[data-figure="tenant"]').inner_text() == "—"  # none given
    forged = await page.request.post(action, form={"type": "page.later"}, max_redirects=0)
    assert forged.status == 403  # signed in, but no CSRF token: nothing changed
    assert attempts == [1]
    assert worker.relay is not None
    assert worker.relay.released_early == 0

    await page.click('[data-action="retry-now"]')
    await page.click("text=Yes, retry now")
    flash = await page.locator('[role="status"]').inner_text()
    assert "runs now" in flash, flash
    relay = worker.relay
    await until(lambda: attempts == [1, 2], "the retried job to run now")
    await until(lambda: relay.released_early == 1, "the relay to finish the original")
    assert attempts == [1, 2]
    await page.close()


async def _requeue(browser: Any, url: str, job_id: str, runs: list[int]) -> None:
    page = await new_page(browser)
    await sign_in(page, url, TOKEN, f"/ui/jobs/{quote(job_id)}")
    assert await page.locator('[data-figure="status"]').inner_text() == "dead_lettered"
    outcome = await page.locator('tr[data-attempt="1"] [data-figure="outcome"]').inner_text()
    assert "dead-lettered" in outcome
    assert "RuntimeError: dies the first time" in outcome
    await page.click('[data-action="requeue"]')
    assert await page.locator('[data-figure="to-requeue"]').inner_text() == "1"
    await page.click("text=Yes, requeue")
    flash = await page.locator('[role="status"]').inner_text()
    assert "Requeued 1 of 1" in flash, flash
    await until(lambda: len(runs) == 2, "the requeued job to run again")
    await page.close()


async def _key_search(browser: Any, url: str, job_id: str) -> None:
    page = await new_page(browser)
    await sign_in(page, url, TOKEN, "/")
    await page.fill('form.find input[name="id"]', "key:cust-42")
    await page.click("form.find button")
    # Three types are declared: the page asks which one's topics to read.
    assert "Choose the job type" in await page.locator('[data-figure="problem"]').inner_text()
    await page.select_option('select[name="type"]', "page.flaky")
    await page.click("text=Find jobs")
    await page.wait_for_selector(f'tr[data-job-id="{job_id}"]')
    summary = await page.locator('[data-figure="summary"]').inner_text()
    assert summary.startswith("1 job of type page.flaky with key 'cust-42'")
    await fits(page, "dashboard-job-search")
    await page.click(f'tr[data-job-id="{job_id}"] a')
    await page.wait_for_selector('[data-card="attempts"]')
    assert job_id in page.url
    await page.close()
