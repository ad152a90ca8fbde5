"""`stream-jobs serve` as a user runs it: a property-based run of its OpenAPI schema
(schemathesis), and the dashboard in headless Chromium while jobs run, down to
requeueing a dead letter from the DLQ page.

The browser is Debian's `chromium` (ops/setup-system.sh installs it), driven by
playwright (tests/integration/browser.py); each page is checked at 1280 and 390 px wide,
with screenshots.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from pydantic import SecretStr
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.gateway import create_app
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.settings import Settings
from tests.waiting import until

from ..conftest import Stack
from .browser import chromium, fits, needs_chromium, new_page, reload

TOKEN = "served-gw-token-9a7e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.1


@dataclass(frozen=True)
class Served:
    settings: Settings
    url: str


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A gateway process on fresh topics: `gw.ui` fails jobs asked to, straight to the DLQ."""
    topics_dir = tmp_path_factory.mktemp("gw-topics")
    (topics_dir / "gw.ui.toml").write_text('partitions = 1\nretry_tiers = ["1s"]\n'
                                           "max_attempts = 1\n")
    prefix = f"t{uuid.uuid4().hex[:12]}"
    job_settings = Settings(kafka_bootstrap=stack.kafka_bootstrap,
                            database_url=stack.database_url, topic_prefix=prefix,
                            topics_dir=topics_dir)
    # A loop of its own: asyncio.run would unset the current loop, which the async
    # tests of the session share.
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(apply(job_settings, load_job_types(topics_dir)))
    finally:
        loop.close()
    gateway_settings = job_settings.model_copy(update={
        "gateway_token": SecretStr(TOKEN), "gateway_sample_interval_s": 1.0})
    # uvicorn on its own thread and event loop, as `stream-jobs serve` runs it.
    server = uvicorn.Server(uvicorn.Config(create_app(gateway_settings), host="127.0.0.1",
                                           port=_free_port(), log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("the gateway did not start")
            time.sleep(POLL_S)  # a poll interval, not a wait for an outcome
        port = server.servers[0].sockets[0].getsockname()[1]
        yield Served(job_settings, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# -- the OpenAPI schema, exercised -------------------------------------------------------


# schemathesis' own strategies trip a deprecation warning of hypothesis; not ours to fix.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_openapi_schema_holds(served: Served) -> None:
    """Whatever a client sends, each route answers as its schema says, never with a 500."""
    api = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 7

    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=4, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def holds(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=AUTH, timeout=30, checks=[
                not_a_server_error, status_code_conformance, content_type_conformance,
                response_schema_conformance])

        holds()


# -- the dashboard in a browser ----------------------------------------------------------




@needs_chromium
async def test_dashboard_in_a_browser(served: Served) -> None:
    from playwright.async_api import Page

    job_app = App(served.settings)

    @job_app.job("gw.ui", concurrency=4)
    async def run_ui(job: dict[str, object], ctx: JobContext) -> None:
        if job.get("fail") and ctx.attempt == 1:
            raise PermanentError("asked to fail")

    async def figure(page: Page, name: str) -> int:
        text = await page.locator(f'[data-type="gw.ui"] [data-figure="{name}"]').inner_text()
        return int(text.replace(",", "").replace("—", "0"))

    async with chromium() as browser, httpx.AsyncClient(base_url=served.url,
                                                        headers=AUTH) as http:
        page = await new_page(browser)
        await page.goto(served.url + "/")
        await page.wait_for_selector('[data-type="gw.ui"]')

        # Jobs arrive: the lag shown grows to what was enqueued.
        enqueued = await http.post("/jobs/gw.ui", json={"jobs": [
            {"payload": {"n": i, "fail": i < 2}} for i in range(30)]})
        assert enqueued.status_code == 202, enqueued.text
        failing = enqueued.json()["job_ids"][:2]

        async def shows(name: str, at_least: int) -> bool:
            await reload(page)
            return await figure(page, name) >= at_least

        await until(lambda: shows("lag", 30), "the dashboard to show a lag of 30")

        # A worker runs them: the lag falls to 0, done and dead letters count up.
        worker = job_app.worker("gw.ui", report_interval_s=0.3)
        running = asyncio.create_task(worker.run())
        try:
            async def drained() -> bool:
                await reload(page)
                return (await figure(page, "lag") == 0 and await figure(page, "dlq") == 2
                        and await figure(page, "done") == 28)

            await until(drained, "the dashboard to show 28 done, 2 dead letters, no lag")
            await fits(page, "dashboard-overview")

            # The DLQ page: sign in, see the reason, requeue one letter, confirming.
            await page.click('[data-type="gw.ui"] a[href="/ui/dlq/gw.ui"]')
            await page.fill('input[name="token"]', TOKEN)
            await page.click('button[type="submit"]')
            await page.wait_for_selector('[data-figure="letters"]')
            assert await page.locator('[data-figure="letters"]').inner_text() == "2"
            assert "permanent" in await page.content()
            await page.click(f'tr[data-job-id="{failing[0]}"] a.button')
            assert await page.locator('[data-figure="to-requeue"]').inner_text() == "1"
            await page.click("text=Yes, requeue")
            flash = await page.locator('[role="status"]').inner_text()
            assert "Requeued 1 of 1" in flash, flash
            await fits(page, "dashboard-dlq")

            # The requeued job ran again (attempt 2) and finished.
            async def finished() -> bool:
                found = (await http.get(f"/jobs/{failing[0]}",
                                        params={"type": "gw.ui"})).json()
                return bool(found["status"] == "finished")

            await until(finished, "the requeued job to finish")
        finally:
            worker.request_stop()
            await running
