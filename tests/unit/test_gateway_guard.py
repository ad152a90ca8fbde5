"""The gateway's guard, sessions and headers, in process (no Kafka: nothing here gets as
far as a route that needs it). The browser probes are tests/integration/test_gateway_hostile.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
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


@pytest.fixture
def http(tmp_path: Path) -> TestClient:
    app = create_app(_settings(tmp_path), sample=False)
    # No lifespan: the client is never started, nothing here enqueues.
    return TestClient(app, base_url="http://127.0.0.1:8080", follow_redirects=False)


def _sign_in(http: TestClient, token: str = TOKEN) -> str:
    answer = http.post("/login", data={"token": token, "next": "/"})
    assert answer.status_code == 303, answer.text
    return answer.cookies[SESSION_COOKIE]


def test_each_sign_in_starts_a_fresh_session_that_sign_out_ends(http: TestClient) -> None:
    first = _sign_in(http)
    second = _sign_in(http)
    assert first != second
    assert len(first) >= 40
    http.cookies.clear()
    assert http.get(PAGE, cookies={SESSION_COOKIE: second}).status_code == 404  # signed in
    # The first sign-in's session ended when the second started in the same browser.
    assert http.get(PAGE, cookies={SESSION_COOKIE: first}).status_code == 303
    page = http.get("/ui/dlq/no.such.type", cookies={SESSION_COOKIE: second})
    assert page.status_code == 404
    # Sign-out needs the form's CSRF token, and then the cookie is worth nothing.
    assert http.post("/logout", cookies={SESSION_COOKIE: second}).status_code == 403
    csrf = http.app.state.gateway.session_of(second).csrf  # type: ignore[attr-defined]
    out = http.post("/logout", data={"csrf": csrf}, cookies={SESSION_COOKIE: second})
    assert out.status_code == 303
    assert http.get(PAGE, cookies={SESSION_COOKIE: second}).status_code == 303


def test_a_new_token_ends_every_session(http: TestClient) -> None:
    session = _sign_in(http)
    gateway = http.app.state.gateway  # type: ignore[attr-defined]
    gateway.settings = gateway.settings.model_copy(
        update={"gateway_token": SecretStr("a-new-token")})
    assert http.get(PAGE, cookies={SESSION_COOKIE: session}).status_code == 303


def test_a_forged_or_old_cookie_is_nothing(http: TestClient) -> None:
    for cookie in ("", "x" * 43, "0" * 64):
        assert http.get(PAGE, cookies={SESSION_COOKIE: cookie}).status_code == 303


def test_the_cookie_is_secure_over_tls_behind_a_trusted_proxy(tmp_path: Path) -> None:
    trusting = TestClient(create_app(_settings(tmp_path, gateway_trusted_proxies="*"),
                                     sample=False), base_url="http://127.0.0.1:8080",
                          follow_redirects=False)
    answer = trusting.post("/login", data={"token": TOKEN},
                           headers={"X-Forwarded-Proto": "https"})
    assert "secure" in answer.headers["set-cookie"].lower()
    assert "httponly" in answer.headers["set-cookie"].lower()
    assert "samesite=strict" in answer.headers["set-cookie"].lower()
    # Without the setting, the header is anyone's to send and changes nothing.
    plain = TestClient(create_app(_settings(tmp_path), sample=False),
                       base_url="http://127.0.0.1:8080", follow_redirects=False)
    answer = plain.post("/login", data={"token": TOKEN}, headers={"X-Forwarded-Proto": "https"})
    assert "secure" not in answer.headers["set-cookie"].lower()


def test_wrong_tokens_pause_sign_in(http: TestClient) -> None:
    for _ in range(MAX_FAILURES):
        assert http.post("/login", data={"token": "guess"}).status_code == 401
    paused = http.post("/login", data={"token": TOKEN})  # even the right one, for now
    assert paused.status_code == 429
    assert int(paused.headers["retry-after"]) > 0
    assert "Too many wrong tokens" in paused.text


def test_a_form_without_the_sessions_csrf_token_changes_nothing(http: TestClient) -> None:
    session = _sign_in(http)
    for form in ({}, {"csrf": "forged"}, {"csrf": ""}):
        answer = http.post("/ui/jobs/some-job/cancel", data={"type": "", **form},
                           cookies={SESSION_COOKIE: session})
        assert answer.status_code == 403, answer.text
        assert "Nothing was changed" in answer.text
        answer = http.post("/ui/dlq/no.such.type/requeue", data={"id": "x", **form},
                           cookies={SESSION_COOKIE: session})
        assert answer.status_code in (403, 404), answer.text


def test_every_answer_carries_the_headers(http: TestClient) -> None:
    for path in ("/", "/login", "/docs", "/openapi.json", "/metrics", "/healthz-nope", PAGE):
        answer = http.get(path)
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
def test_another_host_is_refused(http: TestClient, host: str) -> None:
    answer = http.get("/", headers={"Host": host})
    assert answer.status_code == 400
    assert "STREAM_JOBS_GATEWAY_ALLOWED_HOSTS" in answer.json()["detail"]


def test_the_token_is_checked_before_the_body_is_read(http: TestClient) -> None:
    # Not JSON at all: a parser would say so (422); the guard answers first, from headers.
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        answer = http.post("/jobs/email.send", content=b"[[[[", headers=headers)
        assert answer.status_code == 401, answer.text
        assert answer.headers["connection"] == "close"
    answer = http.post("/jobs/email.send", content=b"[[[[",
                       headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code in (404, 422)  # past the guard: the type, or the body


def test_a_post_from_another_origin_is_refused(http: TestClient) -> None:
    answer = http.post("/jobs/email.send", content=b"{}",
                       headers={"Authorization": f"Bearer {TOKEN}",
                                "Origin": "http://127.0.0.1:8098"})
    assert answer.status_code == 403
    answer = http.post("/login", data={"token": TOKEN}, headers={"Origin": "null"})
    assert answer.status_code == 403
    # The gateway's own origin may.
    answer = http.post("/login", data={"token": TOKEN},
                       headers={"Origin": "http://127.0.0.1:8080"})
    assert answer.status_code == 303


def test_a_login_form_is_read_no_further_than_its_limit(http: TestClient) -> None:
    answer = http.post("/login", content=b"token=" + b"x" * 200_000,
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 413
