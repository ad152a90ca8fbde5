"""The dashboard's schedules, batches, outbox and history pages on the real stack, in a
browser where a person would use them: each asserts what the page shows (data-*
attributes), that its buttons do what the shell's commands do, that an action is refused
without a signed-in session or without the form's CSRF token, and that the page fits
390 px (screenshots `dashboard-<page>-<width>.png`).

The gateway runs as `stream-jobs serve` runs it (uvicorn, on a thread of its own) over
the test's prefix, schema and topics folder. Nothing waits by sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any

import httpx
from pydantic import SecretStr

from ops.chaos.collect import read_topic
from stream_jobs.app import App
from stream_jobs.client import Job, JobClient
from stream_jobs.clock import now_ms
from stream_jobs.context import JobContext
from stream_jobs.gateway import create_app
from stream_jobs.history.store import HistoryStore, WindowRow
from stream_jobs.history.tally import Tally
from stream_jobs.history.windows import window_start
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import lane_topic
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.postgres.pool import connect
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.schedules import Scheduler
from stream_jobs.schedules.state import read_states
from stream_jobs.settings import Settings
from tests.waiting import until

from .browser import chromium, fits, needs_chromium, new_page, sign_in
from .conftest import Declare
from .served_gateway import free_port

TOKEN = "pages-features-token-4c1d"
POLL_S = 0.1
TICK = "tick.page"
HOURLY = ('[[schedules]]\nname = "hourly"\ncron = "0 * * * *"\ntimezone = "Europe/Berlin"\n'
          'payload = {source = "page"}\n')

pytestmark = needs_chromium


@contextlib.contextmanager
def gateway(settings: Settings) -> Iterator[str]:
    """The gateway on `settings` under uvicorn on a thread of its own; its base URL."""
    import uvicorn

    configured = settings.model_copy(update={"gateway_token": SecretStr(TOKEN),
                                             "gateway_sample_interval_s": 1.0})
    server = uvicorn.Server(uvicorn.Config(create_app(configured), host="127.0.0.1",
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


@contextlib.asynccontextmanager
async def signed_in_http(base_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """An HTTP client with a signed-in session cookie, and the session's CSRF token (read
    from the sign-out form every signed-in page carries)."""
    async with httpx.AsyncClient(base_url=base_url) as http:
        answer = await http.post("/login", data={"token": TOKEN, "next": "/ui/schedules"},
                                 follow_redirects=True)
        page = answer.text
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        yield http, csrf


async def _paused(settings: Settings) -> bool | None:
    rows = {s.name: s for s in await read_states(settings, settings.topic_prefix)}
    return rows["hourly"].paused if "hourly" in rows else None


async def test_schedules_page_pauses_resumes_and_triggers(settings: Settings,
                                                         app: App) -> None:
    from playwright.async_api import Page

    (settings.topics_dir / f"{TICK}.toml").write_text(f"partitions = 1\n{HOURLY}")
    policy = load_job_types(settings.topics_dir)[TICK]
    await apply(settings, {TICK: policy})
    runner = Scheduler(settings, policy, policy.schedules, holder="page scheduler",
                       client=partial(JobClient, settings, {TICK: policy}))
    leading = asyncio.create_task(runner.run())
    row = f'tr[data-schedule="{TICK}:hourly"]'

    async def shows(page: Page, field: str, value: str) -> bool:
        await page.reload()
        cell = page.locator(f"{row} [data-field={field}]")
        # A reading that failed on a loaded machine shows no row: poll again.
        return await cell.count() == 1 and await cell.inner_text() == value

    try:
        with gateway(settings) as url:
            # Open, but its buttons only for a signed-in session; a post without one
            # goes to the sign-in page, a post without the CSRF token changes nothing.
            async with httpx.AsyncClient(base_url=url) as anon:
                page_text = (await anon.get("/ui/schedules")).text
                assert f'data-schedule="{TICK}:hourly"' in page_text
                assert 'data-action="pause"' not in page_text
                refused = await anon.post("/ui/schedules/pause",
                                          data={"name": "hourly", "type": TICK})
                assert refused.status_code == 303
                assert refused.headers["location"].startswith("/login")
            async with signed_in_http(url) as (http, csrf):
                stale = await http.post("/ui/schedules/pause",
                                        data={"name": "hourly", "type": TICK, "csrf": "x"})
                assert stale.status_code == 403
                triggered = await http.post("/ui/schedules/trigger",
                                            data={"name": "hourly", "type": TICK})
                assert triggered.status_code == 403
                assert csrf
            assert await _paused(settings) in (None, False)

            async with chromium() as browser:
                page = await new_page(browser)
                await sign_in(page, url, TOKEN, "/ui/schedules")
                await page.wait_for_selector(row)
                text = await page.locator(row).inner_text()
                assert "cron 0 * * * *" in text, text
                assert "Europe/Berlin" in text, text
                await until(lambda: shows(page, "leader", "page scheduler"),
                            "the page to name the leader", within_s=30)

                await page.click(f'{row} button[data-action="pause"]')
                flash = await page.locator('[role="status"]').inner_text()
                assert "paused" in flash, flash
                assert await page.locator(f"{row} [data-field=paused]").inner_text() == "yes"
                assert await _paused(settings) is True
                await fits(page, "dashboard-schedules")

                await page.click(f'{row} button[data-action="resume"]')
                assert "resumed" in await page.locator('[role="status"]').inner_text()
                assert await page.locator(f"{row} [data-field=paused]").inner_text() == "no"
                assert await _paused(settings) is False

                await page.click(f'{row} a[data-action="trigger"]')
                await page.click("text=Yes, trigger")
                flash = await page.locator('[role="status"]').inner_text()
                assert "triggered" in flash, flash
                job_id = flash.rsplit("job ", 1)[1].strip()
    finally:
        runner.request_stop()
        await leading

    async def enqueued() -> bool:
        records = await read_topic(settings, lane_topic(settings.topic_prefix, TICK))
        return any(dict(r.headers).get(HEADER_JOB_ID) == job_id.encode() for r in records)

    await until(enqueued, "the triggered job in the lane", within_s=30)


async def test_schedules_page_says_when_none_is_declared(settings: Settings, app: App,
                                                        declare: Declare) -> None:
    await declare("plain.page", partitions=1)
    with gateway(settings) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            text = (await http.get("/ui/schedules")).text
    assert 'data-empty="schedules"' in text
    assert "No schedule is declared" in text


async def test_batches_page_shows_progress_as_members_finish(
        settings: Settings, app: App, declare: Declare) -> None:
    from playwright.async_api import Page

    await declare("batch.member", partitions=2)
    await declare("batch.done", partitions=1)

    @app.job("batch.member", ordering="unordered", concurrency=8)
    async def member(job: dict[str, int], ctx: JobContext) -> None:
        return None

    @app.job("batch.done")
    async def done(job: dict[str, Any], ctx: JobContext) -> None:
        return None

    async with app.client() as client:
        batch_id = await client.batch([Job("batch.member", {"n": n}) for n in range(12)],
                                      on_success=Job("batch.done", {"album": "ok"}))
    row = f'tr[data-batch="{batch_id}"]'

    async def bar(page: Page, reload: bool = True) -> dict[str, str | None]:
        if reload:
            await page.reload()
        found = page.locator(f"{row} .progress")
        if not await found.count():
            return {}  # a reading that failed on a loaded machine shows no row
        return {k: await found.get_attribute(f"data-{k}")
                for k in ("succeeded", "failed", "pending")}

    with gateway(settings) as url:
        async with chromium() as browser:
            page = await new_page(browser)
            await page.goto(url + "/ui/batches")
            assert await bar(page, reload=False) == {"succeeded": "0", "failed": "0",
                                                     "pending": "12"}
            assert await page.locator(f"#open {row}").get_attribute("data-state") == "running"

            worker = app.worker("batch.member")
            callbacks = app.worker("batch.done")
            stop = asyncio.Event()
            relay = OutboxRelay(settings)
            tasks = [asyncio.create_task(worker.run()), asyncio.create_task(callbacks.run()),
                     asyncio.create_task(relay.run(stop))]
            try:
                async def all_done() -> bool:
                    return await bar(page) == {"succeeded": "12", "failed": "0",
                                               "pending": "0"}

                await until(all_done, "the page to show 12 of 12 succeeded", within_s=60)
            finally:
                stop.set()
                worker.request_stop()
                callbacks.request_stop()
                await asyncio.gather(*tasks)
            assert await page.locator(f"#finished {row}").get_attribute(
                "data-state") == "succeeded"
            assert "on_success: written" in await page.locator(f"#finished {row}").inner_text()
            await fits(page, "dashboard-batches")

            await page.click(f"#finished {row} a")
            callback = page.locator('[data-callback="on_success"]')
            assert await callback.get_attribute("data-written") == "yes"

    # An ID no batch has: a page that says so, 404.
    with gateway(settings) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            missing = await http.get("/ui/batches/no-such-batch")
    assert missing.status_code == 404
    assert "No batch or chain has the ID" in missing.text


async def test_outbox_page_shows_rows_waiting_without_a_relay(
        settings: Settings, app: App, declare: Declare) -> None:
    await declare("outbox.page", partitions=1)
    client = app.client()  # never entered: writing through conn= needs no Kafka
    conn = await connect(settings)
    try:
        async with conn.transaction():
            await client.enqueue("outbox.page", {"n": 1}, conn=conn)
            await client.enqueue("outbox.page", {"n": 2}, conn=conn)
    finally:
        await conn.close()
    topic = lane_topic(settings.topic_prefix, "outbox.page")
    with gateway(settings) as url:
        async with chromium() as browser:
            page = await new_page(browser)
            await page.goto(url + "/ui/outbox")
            assert await page.locator('[data-figure="depth"]').inner_text() == "2"
            assert await page.locator(
                f'tr[data-topic="{topic}"] [data-field="rows"]').inner_text() == "2"
            await fits(page, "dashboard-outbox")
            async with OutboxRelay(settings) as relay:
                assert await relay.drain() == 2
            await page.reload()
            assert await page.locator('[data-figure="depth"]').inner_text() == "0"
    # A schema without the outbox table: one line that says so.
    bare = settings.model_copy(update={"database_schema": "no_such_schema_pages"})
    with gateway(bare) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            text = (await http.get("/ui/outbox")).text
    assert 'data-empty="outbox"' in text
    assert "There is no outbox table" in text


def _tally(outcomes: dict[str, int]) -> Tally:
    tally = Tally(dict(outcomes))
    for _ in range(sum(outcomes.values())):
        tally.observe(0.02, 0.3)
    return tally


async def test_history_page_charts_each_span(settings: Settings, app: App,
                                             declare: Declare) -> None:
    await declare("hist.page", partitions=1)
    await declare("hist.quiet", partitions=1)
    minute = window_start(now_ms(), 60)
    hour = window_start(now_ms(), 3600)
    store = HistoryStore(settings)
    try:
        await store.put([
            WindowRow("hist.page", 60, minute - 3 * 60_000,
                      _tally({"succeeded": 40, "dead_lettered": 5})),
            WindowRow("hist.page", 60, minute - 2 * 60_000, _tally({"succeeded": 15})),
            WindowRow("hist.page", 3600, hour - 3 * 3_600_000, _tally({"succeeded": 100})),
            WindowRow("hist.page", 3600, hour - 72 * 3_600_000, _tally({"succeeded": 100})),
            WindowRow("hist.page", 3600, hour, _tally({"succeeded": 55, "dead_lettered": 5}))])
    finally:
        await store.close()
    card = '[data-history="hist.page"]'
    with gateway(settings) as url:
        async with chromium() as browser:
            page = await new_page(browser)
            await page.goto(url + "/ui/history?type=hist.page")
            assert await page.locator(f"{card} [data-figure=finished]").inner_text() == "60"
            assert await page.locator(f"{card} [data-figure=failed]").inner_text() == "5"
            assert await page.locator(f"{card} svg.chart").count() == 4
            assert await page.locator(f"{card} polyline").count() >= 1
            assert await page.locator('nav.tabs a[href="/ui/history?type=hist.page"]'
                                      '[aria-current="page"]').count() == 1
            await fits(page, "dashboard-history")
            for span, finished in (("24h", "160"), ("7d", "260")):
                await page.click(f'a[data-span="{span}"]')
                await page.wait_for_selector(f'{card}[data-span="{span}"]')
                assert await page.locator(f"{card} [data-figure=finished]").inner_text() \
                    == finished, span
                assert "jobs/h" in await page.locator(card).inner_text()
            # Every type, one card each; one without history says how to start it.
            await page.goto(url + "/ui/history")
            assert await page.locator("[data-history]").count() == 2
            quiet = await page.locator('[data-history="hist.quiet"]').inner_text()
            assert "stream-jobs history" in quiet
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/ui/history?span=2w")).status_code == 400
            assert (await http.get("/ui/history?type=nope.type")).status_code == 404


async def test_pages_say_when_postgres_does_not_answer(settings: Settings, app: App) -> None:
    from .test_gateway import served

    (settings.topics_dir / f"{TICK}.toml").write_text(f"partitions = 1\n{HOURLY}")
    gone = settings.model_copy(update={
        "database_url": f"postgresql://stream_jobs@127.0.0.1:{free_port()}/stream_jobs"})
    async with served(create_app(gone)) as http:
        pages = {path: (await http.get(path)).text
                 for path in ("/ui/schedules", "/ui/batches", "/ui/outbox",
                              f"/ui/history?type={TICK}")}
    for path, name in (("/ui/schedules", "schedules"), ("/ui/batches", "batches"),
                       ("/ui/outbox", "outbox"), (f"/ui/history?type={TICK}", "history")):
        assert f'data-problem="{name}"' in pages[path], path
        assert "Postgres did not answer" in pages[path], path
