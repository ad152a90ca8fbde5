"""The gateway's host and origin rules (stream_jobs/gateway/origins.py), and its sessions
and sign-in throttle (sessions.py): pure, so every case is a call."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.gateway.origins import AllowedHosts, cross_origin, origin_of, split_host
from stream_jobs.gateway.sessions import LoginThrottle, Sessions, fingerprint

OWN = origin_of("http", "127.0.0.1:8099")


@pytest.mark.parametrize(("header", "expected"), [
    ("127.0.0.1:8099", ("127.0.0.1", 8099)), ("LOCALHOST", ("localhost", None)),
    ("[::1]:80", ("::1", 80)), ("[::1]", ("::1", None)),
    ("evil.example/x", None), ("a@b", None), ("host:0", None), ("host:99999", None),
    ("host:port", None), ("[nothost]:80", None), ("", None),
])
def test_split_host(header: str, expected: tuple[str, int | None] | None) -> None:
    assert split_host(header) == expected


def test_default_hosts_are_the_bind_address_and_loopback() -> None:
    hosts = AllowedHosts.of("", "10.1.2.3")
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080", "10.1.2.3:8080"):
        assert hosts.allows(host), host
    # A name an attacker's DNS points at 127.0.0.1 (rebinding) is not one of them.
    for host in ("rebind.attacker.example:8080", "10.1.2.4", None, "localhost.evil:80"):
        assert not hosts.allows(host), host


def test_a_wildcard_bind_allows_ip_addresses_not_names() -> None:
    hosts = AllowedHosts.of("", "0.0.0.0")
    assert hosts.allows("192.168.1.20:8080")
    assert hosts.allows("localhost")
    assert not hosts.allows("rebind.attacker.example")


def test_configured_hosts_replace_the_default() -> None:
    hosts = AllowedHosts.of(" jobs.example.com , [::1]", "127.0.0.1")
    assert hosts.allows("jobs.example.com")
    assert hosts.allows("JOBS.example.com:443")
    assert hosts.allows("[::1]:8080")
    assert not hosts.allows("127.0.0.1")
    assert AllowedHosts.of("*", None).allows("anything.example")


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_safe_methods_are_never_refused(method: str) -> None:
    assert cross_origin(method, OWN, [("origin", "http://evil.example")]) is None


@pytest.mark.parametrize("headers", [
    [], [("origin", "http://127.0.0.1:8099")], [("Origin", "http://127.0.0.1:8099"),
                                                ("sec-fetch-site", "same-origin")],
    [("referer", "http://127.0.0.1:8099/ui/jobs/x/cancel")], [("sec-fetch-site", "none")],
])
def test_programs_and_own_pages_may_post(headers: list[tuple[str, str]]) -> None:
    assert cross_origin("POST", OWN, headers) is None


@pytest.mark.parametrize("headers", [
    [("origin", "http://127.0.0.1:8098")],        # another port of the same host
    [("origin", "http://localhost:8099")],        # another name: another site
    [("origin", "null")],                         # a sandboxed frame, a file
    [("origin", "garbage")],
    [("sec-fetch-site", "same-site")],
    [("sec-fetch-site", "cross-site"), ("origin", "http://127.0.0.1:8099")],
    [("referer", "http://127.0.0.1:8098/attack.html")],
])
def test_another_origin_may_not_post(headers: list[tuple[str, str]]) -> None:
    why = cross_origin("POST", OWN, headers)
    assert why is not None
    assert "only from its own pages" in why


def test_a_tls_proxy_without_trust_is_named() -> None:
    assert cross_origin("POST", OWN, [("origin", "https://127.0.0.1:8099")]) is not None
    why = cross_origin("POST", origin_of("http", "jobs.example.com"),
                       [("origin", "https://jobs.example.com")])
    assert why is not None
    assert "STREAM_JOBS_GATEWAY_TRUSTED_PROXIES" in why


@given(port=st.integers(1, 65535), host=st.sampled_from(["127.0.0.1", "localhost", "a.b"]),
       scheme=st.sampled_from(["http", "https"]))
def test_only_the_exact_origin_passes(port: int, host: str, scheme: str) -> None:
    origin = f"{scheme}://{host}:{port}"
    same = (scheme, host, port) == OWN
    assert (cross_origin("POST", OWN, [("origin", origin)]) is None) is same


def test_a_session_per_sign_in_ended_by_sign_out_expiry_and_a_new_token() -> None:
    sessions = Sessions(ttl_s=100)
    token = fingerprint("token-1")
    first, second = sessions.start(token, 0), sessions.start(token, 0)
    assert first.id != second.id
    assert first.csrf != second.csrf
    assert sessions.find(first.id, token, 1) == first
    sessions.end(first.id)
    assert sessions.find(first.id, token, 1) is None
    assert sessions.find(second.id, fingerprint("token-2"), 1) is None  # the token changed
    third = sessions.start(token, 0)
    assert sessions.find(third.id, token, 100) is None  # expired
    assert sessions.find("made-up", token, 1) is None
    assert sessions.find(None, token, 1) is None
    assert third.csrf_matches(third.csrf)
    assert not third.csrf_matches(first.csrf)
    assert not third.csrf_matches(None)
    assert not third.csrf_matches("")


def test_sessions_are_bounded() -> None:
    sessions = Sessions(limit=3)
    opened = [sessions.start("t", 0) for _ in range(5)]
    assert len(sessions) == 3
    assert sessions.find(opened[0].id, "t", 1) is None
    assert sessions.find(opened[-1].id, "t", 1) == opened[-1]


def test_sign_in_is_throttled_per_client_and_in_all() -> None:
    throttle = LoginThrottle(max_failures=3, max_failures_all=5, window_s=60)
    for second in range(3):
        assert throttle.wait_s("a", second) == 0
        throttle.failed("a", second)
    assert throttle.wait_s("a", 3) == pytest.approx(57)
    assert throttle.wait_s("b", 3) == 0  # another client is not held by a's failures
    throttle.failed("b", 4)
    throttle.failed("c", 5)
    # 5 failures within the window from anyone: everyone waits, until the window moves.
    assert throttle.wait_s("d", 6) == pytest.approx(54)
    assert throttle.wait_s("a", 60.5) == 0  # its first failure left the window
    assert throttle.wait_s("d", 66) == 0
