"""The gateway's guard, sessions and headers, in process (no Kafka: nothing here gets as
far as a route that needs it). The browser probes are tests/integration/test_gateway_hostile.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from stream_jobs.gateway import create_app
from stream_jobs.gateway.sessions import MAX_FAILURES
from stream_jobs.gateway.state import SESSION_COOKIE
from stream_jobs.settings import Settings

TOKEN = "guard-token-0b7d"
# A type name no topics folder declares: a signed-in DLQ page answers 404 for it without
# reaching Kafka, a signed-out one sends the browser to /login.
PAGE = "/ui/dlq/no.such.type"


def _settings(tmp_path: Path, **more: object) -> Settings:
    topics = tmp_path / "topics"
    topics.mkdir(exist_ok=True)
    (topics / "email.send.toml").write_text("partitions = 1\n")
    return Settings(topics_dir=topics, gateway_token=SecretStr(TOKEN),
                    database_url="postgresql://u@127.0.0.1:1/db", **more)  # type: ignore[arg-type]


def _client(app: FastAPI) -> httpx.AsyncClient:
    # No lifespan: the gateway's client is never started, nothing here enqueues.
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                             base_url="http://127.0.0.1:8080", follow_redirects=False)


@pytest.fixture
async def app(tmp_path: Path) -> FastAPI:
    return create_app(_settings(tmp_path), sample=False)


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(app) as client:
        yield client


def _with(session: str) -> dict[str, str]:
    return {"Cookie": f"{SESSION_COOKIE}={session}"}


async def _status(http: httpx.AsyncClient, path: str, session: str) -> int:
    return (await http.get(path, headers=_with(session))).status_code


async def _sign_in(http: httpx.AsyncClient, token: str = TOKEN) -> str:
    answer = await http.post("/login", data={"token": token, "next": "/"})
    assert answer.status_code == 303, answer.text
    return answer.cookies[SESSION_COOKIE]


async def test_each_sign_in_starts_a_fresh_session_that_sign_out_ends(
        app: FastAPI, http: httpx.AsyncClient) -> None:
    first = await _sign_in(http)
    second = await _sign_in(http)  # the same browser (its cookie went along) signs in again
    assert first != second
    assert len(first) >= 40
    http.cookies.clear()
    assert await _status(http, PAGE, second) == 404  # signed in: past the login
    # The first sign-in's session ended when the second started in the same browser.
    assert await _status(http, PAGE, first) == 303
    # Sign-out needs the form's CSRF token, and then the cookie is worth nothing.
    assert (await http.post("/logout", headers=_with(second))).status_code == 403
    csrf = app.state.gateway.session_of(second).csrf
    out = await http.post("/logout", data={"csrf": csrf}, headers=_with(second))
    assert out.status_code == 303
    assert await _status(http, PAGE, second) == 303


async def test_a_new_token_ends_every_session(app: FastAPI, http: httpx.AsyncClient) -> None:
    session = await _sign_in(http)
    gateway = app.state.gateway
    gateway.settings = gateway.settings.model_copy(
        update={"gateway_token": SecretStr("a-new-token")})
    assert await _status(http, PAGE, session) == 303


async def test_a_forged_or_old_cookie_is_nothing(http: httpx.AsyncClient) -> None:
    for cookie in ("", "x" * 43, "0" * 64):
        assert await _status(http, PAGE, cookie) == 303


async def test_the_cookie_is_secure_over_tls_behind_a_trusted_proxy(tmp_path: Path) -> None:
    async with _client(create_app(_settings(tmp_path, gateway_trusted_proxies="*"),
                                  sample=False)) as trusting:
        answer = await trusting.post("/login", data={"token": TOKEN},
                                     headers={"X-Forwarded-Proto": "https"})
    cookie = answer.headers["set-cookie"].lower()
    assert "secure" in cookie
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    # Without the setting, the header is anyone's to send and changes nothing.
    async with _client(create_app(_settings(tmp_path), sample=False)) as plain:
        answer = await plain.post("/login", data={"token": TOKEN},
                                  headers={"X-Forwarded-Proto": "https"})
    assert "secure" not in answer.headers["set-cookie"].lower()


async def test_wrong_tokens_pause_sign_in(http: httpx.AsyncClient) -> None:
    for _ in range(MAX_FAILURES):
        assert (await http.post("/login", data={"token": "guess"})).status_code == 401
    paused = await http.post("/login", data={"token": TOKEN})  # even the right one, for now
    assert paused.status_code == 429
    assert int(paused.headers["retry-after"]) > 0
    assert "Too many wrong tokens" in paused.text


async def test_a_form_without_the_sessions_csrf_token_changes_nothing(
        http: httpx.AsyncClient) -> None:
    session = await _sign_in(http)
    http.cookies.clear()
    for form in ({}, {"csrf": "forged"}, {"csrf": ""}):
        answer = await http.post("/ui/jobs/some-job/cancel", data={"type": "", **form},
                                 headers=_with(session))
        assert answer.status_code == 403, answer.text
        assert "Nothing was changed" in answer.text
        answer = await http.post("/ui/dlq/email.send/requeue", data={"id": "x", **form},
                                 headers=_with(session))
        assert answer.status_code == 403, answer.text


async def test_every_answer_carries_the_headers(http: httpx.AsyncClient) -> None:
    for path in ("/", "/login", "/docs", "/openapi.json", "/metrics", "/healthz-nope", PAGE):
        answer = await http.get(path)
        csp = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp
        script = re.search(r"script-src ([^;]+)", csp)
        assert script is not None
        assert "unsafe" not in script.group(1)
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("host", ["evil.example", "127.0.0.1.nip.example:8080",
                                  "localhost.evil:8080", "a/b", ""])
async def test_another_host_is_refused(http: httpx.AsyncClient, host: str) -> None:
    answer = await http.get("/", headers={"Host": host})
    assert answer.status_code == 400
    assert "STREAM_JOBS_GATEWAY_ALLOWED_HOSTS" in answer.json()["detail"]


async def test_the_token_is_checked_before_the_body_is_read(http: httpx.AsyncClient) -> None:
    # Not JSON at all: a parser would say so (422); the guard answers first, from headers.
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        answer = await http.post("/jobs/email.send", content=b"[[[[", headers=headers)
        assert answer.status_code == 401, answer.text
        assert answer.headers["connection"] == "close"
    answer = await http.post("/jobs/email.send", content=b"[[[[",
                             headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 422  # past the guard: the body is read, and is not JSON


async def test_a_post_from_another_origin_is_refused(http: httpx.AsyncClient) -> None:
    answer = await http.post("/jobs/email.send", content=b"{}",
                             headers={"Authorization": f"Bearer {TOKEN}",
                                      "Origin": "http://127.0.0.1:8098"})
    assert answer.status_code == 403
    answer = await http.post("/login", data={"token": TOKEN}, headers={"Origin": "null"})
    assert answer.status_code == 403
    # The gateway's own origin may.
    answer = await http.post("/login", data={"token": TOKEN},
                             headers={"Origin": "http://127.0.0.1:8080"})
    assert answer.status_code == 303


async def test_a_login_form_is_read_no_further_than_its_limit(http: httpx.AsyncClient) -> None:
    answer = await http.post("/login", content=b"token=" + b"x" * 200_000,
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 413
