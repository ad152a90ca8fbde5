"""`stream-jobs serve` as the manual shows it, in a process of its own on loopback: every
curl line of README.md and docs/ runs as written, a cancel takes its JSON body whatever
Content-Type `curl -d` gives it (never without the token), and the API browser at /docs
works with the network off.

The browser is Debian's `chromium` driven by playwright (as in test_gateway_served.py);
curl is the machine's own. Each is skipped, saying so, where it is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import drop_schema, fresh_prefix, run_async, settings_for

from ..conftest import Stack
from .served_gateway import serve_env, serving

REPO = Path(__file__).resolve().parents[2]
TOKEN = "documented-gw-token-3c9d"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PAGES_PORT = 8080  # the port the pages' samples use; the served one takes its place
CURL = shutil.which("curl")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# The browser reaches the gateway by a name, as on a private network: Swagger UI treats
# a spec on `localhost` or `127.0.0.1` differently (no online validator badge).
GATEWAY_NAME = "gateway.test"


@dataclass(frozen=True)
class Served:
    settings: Settings
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"



@pytest.fixture(scope="module")
def served(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`stream-jobs serve` with the repository's email.send type (the pages' samples use
    it) on a fresh prefix and schema, migrated as `db migrate` would."""
    folder = tmp_path_factory.mktemp("documented-gw")
    topics_dir = folder / "topics"
    topics_dir.mkdir()
    shutil.copy(REPO / "topics" / "email.send.toml", topics_dir)
    settings = settings_for(stack, fresh_prefix(), topics_dir)
    run_async(lambda: apply(settings, load_job_types(topics_dir)))
    run_async(lambda: prepare_schema(settings))
    env = serve_env(settings, topics_dir, STREAM_JOBS_GATEWAY_TOKEN=TOKEN,
                    # The browser's name for it; a name not listed is refused (security.md).
                    STREAM_JOBS_GATEWAY_ALLOWED_HOSTS=f"127.0.0.1,localhost,{GATEWAY_NAME}")
    try:
        with serving(env, folder / "serve.log") as (port, _):
            yield Served(settings, port)
    finally:
        run_async(lambda: drop_schema(settings))



def _enqueue(served: Served, job_id: str) -> None:
    answer = httpx.post(f"{served.url}/jobs/email.send", headers=AUTH, timeout=30, json={
        "payload": {"to": "a@b.c", "subject": "hi"}, "job_id": job_id})
    assert answer.status_code == 202, answer.text


# -- the curl lines of the pages -----------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    page: str
    command: str
    shown: str | None  # the answer the page shows after it, `# {...} (202)`, if any


def documented_curls() -> list[Sample]:
    """Every curl command in a shell block of README.md and docs/, continuation lines
    joined, in page order."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    samples = []
    for page in pages:
        blocks = re.findall(r"^```(?:bash|sh|shell|console)\n(.*?)^```", page.read_text(),
                            flags=re.M | re.S)
        for block in blocks:
            lines = block.splitlines()
            index = 0
            while index < len(lines):
                command = lines[index]
                while command.endswith("\\") and index + 1 < len(lines):
                    index += 1
                    command = command[:-1] + " " + lines[index].strip()
                index += 1
                if not command.lstrip().startswith("curl "):
                    continue
                after = lines[index].strip() if index < len(lines) else ""
                samples.append(Sample(str(page.relative_to(REPO)), command.strip(),
                                      after if after.startswith("# {") else None))
    return samples


def run_curl(served: Served, command: str) -> tuple[int, str]:
    """Run a page's curl line in bash, aimed at the served gateway: (HTTP status, body)."""
    aimed = command.replace(f"localhost:{PAGES_PORT}", f"localhost:{served.port}")
    assert aimed != command, f"not aimed at localhost:{PAGES_PORT}: {command}"
    done = subprocess.run(["bash", "-c", aimed + " --silent --show-error "
                           "--write-out '\\n%{http_code}'"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "STREAM_JOBS_GATEWAY_TOKEN": TOKEN},
                          check=False)
    assert done.returncode == 0, f"{command}\nexit {done.returncode}: {done.stderr}"
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


@pytest.mark.skipif(CURL is None, reason="needs curl")
def test_documented_curls_run_as_written(served: Served) -> None:
    # control.md's cancel is a transcript the manual runs with its own gateway and job
    # (tests/docs/); gateway.md's enqueue is a bash line, run here and shown as a comment.
    samples = documented_curls()
    assert {sample.page for sample in samples} >= {"docs/gateway.md"}
    for sample in samples:
        status, body = run_curl(served, sample.command)
        assert 200 <= status < 300, f"{sample.page}: {sample.command}\n{status} {body}"
        answer = json.loads(body)
        if sample.shown is not None:
            shown = re.fullmatch(r"# (\{.*\})\s*\((\d{3})\)", sample.shown)
            assert shown is not None, f"{sample.page}: cannot read {sample.shown!r}"
            assert status == int(shown.group(2)), f"{sample.page}: {sample.command}"
            assert set(answer) == set(json.loads(shown.group(1))), body
        if "/cancel" in sample.command:
            assert answer["answer"] == "cancelled", body


@pytest.mark.skipif(CURL is None, reason="needs curl")
def test_cancel_takes_its_json_body_whatever_the_content_type(served: Served) -> None:
    """`curl -d` sends application/x-www-form-urlencoded; the cancel reads its body as
    JSON all the same, and still not without the token."""
    job_id = str(uuid.uuid4())
    _enqueue(served, job_id)
    url = f"localhost:{PAGES_PORT}/jobs/{job_id}/cancel?type=email.send"
    # A page of another site can send this form without a preflight, but not the token.
    status, body = run_curl(served, f"curl -X POST \"{url}\" -d '{{\"reason\": \"x\"}}'")
    assert status == 401, body
    # The line control.md showed before it named the content type: the reason is kept.
    status, body = run_curl(served, f"curl -X POST \"{url}\" -H \"Authorization: Bearer "
                            f"$STREAM_JOBS_GATEWAY_TOKEN\" -d '{{\"reason\": \"ordered twice\"}}'")
    assert status == 200, body
    assert json.loads(body)["answer"] == "cancelled", body
    found = httpx.get(f"{served.url}/jobs/{job_id}", params={"type": "email.send"},
                      headers=AUTH, timeout=30).json()
    assert "ordered twice" in json.dumps(found["location"]), found

    # text/plain (a form's other encoding) reads alike; a body that is not JSON is a 422.
    other = str(uuid.uuid4())
    _enqueue(served, other)
    cancel = f"{served.url}/jobs/{other}/cancel"
    plain = httpx.post(cancel, headers={**AUTH, "Content-Type": "text/plain"},
                       content=b'{"reason": "plain"}', timeout=30)
    assert plain.status_code == 200, plain.text
    assert plain.json()["answer"] == "cancelled"
    form = httpx.post(cancel, headers=AUTH, data={"reason": "a form"}, timeout=30)
    assert form.status_code == 422, form.text
    assert form.json()["detail"][0]["type"] == "json_invalid"


# -- the API browser, offline --------------------------------------------------------------


class _References(HTMLParser):
    """The URLs a page's tags load: src and href."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def test_api_docs_page_loads_nothing_from_outside_the_gateway(served: Served) -> None:
    page = httpx.get(f"{served.url}/docs", timeout=30)
    assert page.status_code == 200, page.text
    outside = [url for url in re.findall(r"https?://[^\s\"'<>)]+", page.text)
               if not url.startswith(served.url + "/")]
    assert outside == [], f"/docs references URLs outside the gateway: {outside}"
    references = _References()
    references.feed(page.text)
    kinds = set()
    for url in references.urls:
        asset = httpx.get(urljoin(f"{served.url}/docs", url), timeout=30)
        assert asset.status_code == 200, f"{url}: {asset.status_code}"
        kinds.add(asset.headers["content-type"].split(";")[0])
    assert {"text/javascript", "text/css", "image/png"} <= kinds, kinds
    # One API browser, served offline; ReDoc is off (docs/gateway.md says why).
    assert httpx.get(f"{served.url}/redoc", timeout=30).status_code == 404


def _artifacts() -> Path:
    """Where screenshots are kept: `$STREAM_JOBS_STACK_DIR/artifacts/` (default `.stack/`)."""
    folder = Path(os.environ.get("STREAM_JOBS_STACK_DIR", REPO / ".stack")) / "artifacts"
    if not folder.is_absolute():
        folder = REPO / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium "
                    "(ops/setup-system.sh installs it)")
async def test_api_docs_render_with_the_network_off(served: Served) -> None:
    from playwright.async_api import Route, async_playwright
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    gateway = f"{GATEWAY_NAME}:{served.port}"
    left: list[str] = []

    async def only_the_gateway(route: Route) -> None:
        parts = urlsplit(route.request.url)
        if parts.scheme in ("data", "blob") or parts.netloc == gateway:
            await route.continue_()
        else:
            left.append(route.request.url)
            await route.abort("internetdisconnected")

    async with async_playwright() as driver:
        browser = await driver.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {GATEWAY_NAME} 127.0.0.1"])
        try:
            context = await browser.new_context()
            await context.route("**/*", only_the_gateway)
            page = await context.new_page()
            await page.goto(f"http://{gateway}/docs")
            enqueue = page.locator('.opblock-post [data-path="/jobs/{type}"]')
            with contextlib.suppress(PlaywrightTimeout):  # said below, after what left
                await enqueue.wait_for(timeout=20_000)
            await page.wait_for_load_state("networkidle")
            assert left == [], f"requests left the gateway: {left}"
            assert await enqueue.count() == 1, "Swagger UI did not list POST /jobs/{type}"
            assert await page.locator(".opblock").count() >= 8
            await page.screenshot(path=str(_artifacts() / "api-docs-offline.png"),
                                  full_page=True)
        finally:
            await browser.close()
