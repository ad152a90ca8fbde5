"""`stream-jobs serve` against a hostile page and a hostile client, on loopback only.

Each probe is the one that worked against the gateway before its guard (issue 23):

- a page on another port of the same host (same site: the SameSite=Strict cookie goes
  along) auto-posts the dashboard's cancel and requeue forms, and frames the cancel page
  for a click; a page on another host name (cross site) tries the same;
- a page posts to a `--no-auth` gateway's cancel form;
- a client without the token sends a 16 MB JSON body, alone and three at once while an
  authenticated client enqueues.

The browser is Debian's `chromium` driven by playwright (as in test_gateway_served.py);
the gateway is a `stream-jobs serve` process; the attacker's pages come from a small
HTTP server of the test on another port.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from ops.bench.hostile import big_body, enqueue_latencies, unauthenticated_post
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import drop_schema, fresh_prefix, run_async, settings_for

from ..conftest import Stack
from .served_gateway import serve_env, serving

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hostile-gw-token-71e0"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TYPE = "email.send"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@dataclass(frozen=True)
class Gateway:
    settings: Settings
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None
        return int(found.group(1))

    def enqueue(self, **extra: object) -> str:
        answer = httpx.post(f"{self.url}/jobs/{TYPE}", headers=AUTH, timeout=30, json={
            "payload": {"to": "a@b.c", "subject": "hi"}, **extra})
        assert answer.status_code == 202, answer.text
        job_id: str = answer.json()["job_ids"][0]
        return job_id

    def status(self, job_id: str) -> str:
        answer = httpx.get(f"{self.url}/jobs/{job_id}", headers=AUTH, timeout=30)
        assert answer.status_code == 200, answer.text
        status: str = answer.json()["status"]
        return status


@contextlib.contextmanager
def _serve(settings: Settings, topics_dir: Path, log: Path, *flags: str) -> Iterator[Gateway]:
    env = serve_env(settings, topics_dir, STREAM_JOBS_GATEWAY_TOKEN=TOKEN)
    with serving(env, log, *flags) as (port, process):
        yield Gateway(settings, port, process.pid)


@dataclass(frozen=True)
class Stage:
    settings: Settings
    topics_dir: Path
    folder: Path


@pytest.fixture(scope="module")
def stage(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    folder = tmp_path_factory.mktemp("hostile-gw")
    topics_dir = folder / "topics"
    topics_dir.mkdir()
    shutil.copy(REPO / "topics" / f"{TYPE}.toml", topics_dir)
    settings = settings_for(stack, fresh_prefix(), topics_dir)
    run_async(lambda: apply(settings, load_job_types(topics_dir)))
    run_async(lambda: prepare_schema(settings))
    try:
        yield Stage(settings, topics_dir, folder)
    finally:
        run_async(lambda: drop_schema(settings))


@pytest.fixture(scope="module")
def gateway(stage: Stage) -> Iterator[Gateway]:
    with _serve(stage.settings, stage.topics_dir, stage.folder / "serve.log") as served:
        yield served


# -- the attacker's pages ----------------------------------------------------------------


class Attacker:
    """Pages served from 127.0.0.1 (and `localhost`) on a port of their own."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path.split("?")[0], "").encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def auto_post(self, name: str, action: str, fields: dict[str, str]) -> None:
        inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">'
                         for k, v in fields.items())
        self.pages[name] = (f'<form method="post" action="{action}">{inputs}</form>'
                            "<script>document.forms[0].submit()</script>")

    def __enter__(self) -> Attacker:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium "
                                    "(ops/setup-system.sh installs it)")


async def _browser_probe(gateway: Gateway, attacker: Attacker, *, sign_in: bool,
                         visits: list[str]) -> list[str]:
    """Sign in to the gateway (when it has a token), then open each attacker page; what
    each left on screen."""
    from playwright.async_api import async_playwright

    seen = []
    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=str(CHROMIUM),
                                               args=CHROMIUM_ARGS)
        try:
            page = await (await browser.new_context()).new_page()
            if sign_in:
                await page.goto(f"{gateway.url}/login?next=/")
                await page.fill('input[name="token"]', TOKEN)
                await page.click('button[type="submit"]')
                await page.wait_for_url(f"{gateway.url}/")
            for url in visits:
                await page.goto(url)
                # The auto-post leaves the attacker's page for the gateway's answer.
                await page.wait_for_url(f"{gateway.url}/**", timeout=15_000)
                seen.append(await page.content())
        finally:
            await browser.close()
    return seen


@needs_chromium
async def test_another_port_or_site_cannot_post_the_dashboards_forms(gateway: Gateway) -> None:
    same_site, cross_site, letter = gateway.enqueue(), gateway.enqueue(), gateway.enqueue()
    with Attacker() as attacker:
        attacker.auto_post("/cancel.html", f"{gateway.url}/ui/jobs/{same_site}/cancel",
                           {"type": TYPE, "reason": "forged"})
        attacker.auto_post("/cross.html", f"{gateway.url}/ui/jobs/{cross_site}/cancel",
                           {"type": TYPE, "reason": "forged"})
        attacker.auto_post("/requeue.html", f"{gateway.url}/ui/dlq/{TYPE}/requeue",
                           {"id": letter})
        shown = await _browser_probe(gateway, attacker, sign_in=True, visits=[
            f"http://127.0.0.1:{attacker.port}/cancel.html",   # same site, another port
            f"http://localhost:{attacker.port}/cross.html",    # another site
            f"http://127.0.0.1:{attacker.port}/requeue.html",
        ])
    assert "the gateway takes changes only from its own pages" in shown[0], shown[0]
    assert "the gateway takes changes only from its own pages" in shown[1], shown[1]
    assert "the gateway takes changes only from its own pages" in shown[2], shown[2]
    assert "Requeued" not in shown[2]
    assert gateway.status(same_site) == "pending"
    assert gateway.status(cross_site) == "pending"


@needs_chromium
async def test_the_pages_cannot_be_framed(gateway: Gateway) -> None:
    from playwright.async_api import async_playwright

    job_id = gateway.enqueue()
    confirm = f"{gateway.url}/ui/jobs/{job_id}/cancel?type={TYPE}"
    with Attacker() as attacker:
        attacker.pages["/frame.html"] = (
            f'<p>Win a prize: click the button below!</p><iframe src="{confirm}" '
            'width="800" height="600"></iframe>')
        async with async_playwright() as driver:
            browser = await driver.chromium.launch(executable_path=str(CHROMIUM),
                                                   args=CHROMIUM_ARGS)
            try:
                page = await (await browser.new_context()).new_page()
                await page.goto(f"{gateway.url}/login?next=/")
                await page.fill('input[name="token"]', TOKEN)
                await page.click('button[type="submit"]')
                await page.wait_for_url(f"{gateway.url}/")
                # Signed in, the page itself offers the button...
                await page.goto(confirm)
                assert await page.locator("text=Yes, cancel").count() == 1
                # ... but not inside another origin's frame.
                await page.goto(f"http://127.0.0.1:{attacker.port}/frame.html")
                await page.wait_for_load_state("load")
                buttons = [await frame.locator("text=Yes, cancel").count()
                           for frame in page.frames]
            finally:
                await browser.close()
    assert buttons == [0, 0], buttons
    assert gateway.status(job_id) == "pending"


@needs_chromium
async def test_a_no_auth_gateway_takes_no_post_from_another_page(stage: Stage) -> None:
    with _serve(stage.settings, stage.topics_dir, stage.folder / "no-auth.log",
                "--no-auth") as open_gateway:
        job_id = open_gateway.enqueue()
        with Attacker() as attacker:
            attacker.auto_post("/drive-by.html",
                               f"{open_gateway.url}/ui/jobs/{job_id}/cancel", {"type": TYPE})
            shown = await _browser_probe(open_gateway, attacker, sign_in=False, visits=[
                f"http://localhost:{attacker.port}/drive-by.html"])
        assert "the gateway takes changes only from its own pages" in shown[0], shown[0]
        assert open_gateway.status(job_id) == "pending"
        # Its own page still cancels: the form carries the process's CSRF token.
        _cancel_from_its_page(open_gateway, job_id)
        assert open_gateway.status(job_id) == "cancelled"


def _cancel_from_its_page(gateway: Gateway, job_id: str) -> None:
    page = httpx.get(f"{gateway.url}/ui/jobs/{job_id}/cancel?type={TYPE}", timeout=30)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    posted = httpx.post(f"{gateway.url}/ui/jobs/{job_id}/cancel", timeout=30,
                        data={"type": TYPE, "csrf": csrf.group(1)})
    assert posted.status_code == 303, posted.text


# -- a client without the token ------------------------------------------------------------


def test_a_big_body_without_the_token_is_refused_before_it_is_read(gateway: Gateway) -> None:
    gateway.enqueue()  # warm
    body = big_body()
    before = gateway.rss_kib()
    times = []
    for _ in range(5):
        took, line = unauthenticated_post(gateway.port, body)
        assert line.startswith(b"HTTP/1.1 401"), line
        times.append(took)
    grew_mib = (gateway.rss_kib() - before) / 1024
    assert statistics.median(times) < 0.05, times
    assert grew_mib < 10, f"the gateway grew {grew_mib:.0f} MiB"


def test_three_senders_without_the_token_do_not_stall_an_enqueue(gateway: Gateway) -> None:
    """Before the guard, three such senders took an enqueue's median from 28 ms to 2.2 s.
    The 2x-of-idle goal for the p99 is the bench's (ops/bench/gateway.py: a timed goal on
    this shared machine belongs there); this test holds the line well short of seconds."""
    idle = enqueue_latencies(gateway.url, TOKEN, 100)
    senders = [subprocess.Popen([sys.executable, "-m", "ops.bench.hostile", str(gateway.port)],
                                cwd=REPO) for _ in range(3)]
    try:
        loaded = enqueue_latencies(gateway.url, TOKEN, 100)
    finally:
        for sender in senders:
            sender.kill()
            sender.wait()
    idle_p99 = statistics.quantiles(idle, n=100)[98]
    loaded_p99 = statistics.quantiles(loaded, n=100)[98]
    print(f"enqueue p50 idle {statistics.median(idle) * 1000:.1f} ms, under three senders "
          f"{statistics.median(loaded) * 1000:.1f} ms; p99 {idle_p99 * 1000:.1f} / "
          f"{loaded_p99 * 1000:.1f} ms; load {os.getloadavg()[0]:.1f}")
    assert statistics.median(loaded) < 0.1, (idle_p99, loaded_p99)
    assert loaded_p99 < 0.5, (idle_p99, loaded_p99)
