"""The dashboard's sessions and its sign-in throttle. Pure: time comes in as an argument.

A session starts at each sign-in with a fresh random ID (the cookie) and a fresh random
CSRF token (a hidden field of every form that changes something). The gateway keeps its
sessions in memory: sign-out ends one, a restart ends all of them, and a session names
the token it was signed in with, so it ends when `STREAM_JOBS_GATEWAY_TOKEN` changes.
Nothing in the cookie can be forged or reused after sign-out: it is only a key into that
table. With `--no-auth` there is no sign-in; the one "anonymous" session of the process
carries the CSRF token its forms need.

Sign-in attempts are throttled: after `MAX_FAILURES` wrong tokens from one client within
`FAILURE_WINDOW_S` that client waits out the window, and after `MAX_FAILURES_ALL` wrong
tokens from anyone within the window, everyone does (a guesser with many addresses).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass

SESSION_TTL_S = 12 * 3600
MAX_SESSIONS = 1000
MAX_FAILURES = 5
MAX_FAILURES_ALL = 50
FAILURE_WINDOW_S = 60.0
_CLIENTS_KEPT = 10_000


@dataclass(frozen=True)
class Session:
    id: str
    csrf: str
    expires_s: float
    token_fingerprint: str

    def csrf_matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


def fingerprint(token: str) -> str:
    """Which token a session was signed in with, without keeping the token itself."""
    return hashlib.sha256(b"stream-jobs session token\0" + token.encode()).hexdigest()


class Sessions:
    """The sessions of one gateway process, at most MAX_SESSIONS (the oldest go first)."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, limit: int = MAX_SESSIONS) -> None:
        self._ttl_s = ttl_s
        self._limit = limit
        self._open: OrderedDict[str, Session] = OrderedDict()
        self.anonymous = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                                 float("inf"), "")

    def start(self, token_fingerprint: str, now_s: float) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                          now_s + self._ttl_s, token_fingerprint)
        self._open[session.id] = session
        while len(self._open) > self._limit:
            self._open.popitem(last=False)
        return session

    def find(self, session_id: str | None, token_fingerprint: str | None,
             now_s: float) -> Session | None:
        """The open session with this ID, signed in with the current token; None for an
        unknown, ended, expired or other token's one."""
        if not session_id or token_fingerprint is None:
            return None
        session = self._open.get(session_id)
        if session is None:
            return None
        if session.expires_s <= now_s or not hmac.compare_digest(
                session.token_fingerprint.encode(), token_fingerprint.encode()):
            del self._open[session_id]
            return None
        return session

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._open.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._open)


class LoginThrottle:
    """Wrong sign-ins per client and in all, over a sliding window."""

    def __init__(self, max_failures: int = MAX_FAILURES,
                 max_failures_all: int = MAX_FAILURES_ALL,
                 window_s: float = FAILURE_WINDOW_S) -> None:
        self._max = max_failures
        self._max_all = max_failures_all
        self._window_s = window_s
        self._by_client: OrderedDict[str, deque[float]] = OrderedDict()
        self._all: deque[float] = deque()

    def _trim(self, times: deque[float], now_s: float) -> deque[float]:
        while times and times[0] <= now_s - self._window_s:
            times.popleft()
        return times

    def wait_s(self, client: str, now_s: float) -> float:
        """0 when `client` may try now, else the seconds until it may."""
        waits = [0.0]
        mine = self._by_client.get(client)
        if mine is not None and len(self._trim(mine, now_s)) >= self._max:
            waits.append(mine[-self._max] + self._window_s - now_s)
        if len(self._trim(self._all, now_s)) >= self._max_all:
            waits.append(self._all[-self._max_all] + self._window_s - now_s)
        return max(waits)

    def failed(self, client: str, now_s: float) -> None:
        mine = self._by_client.pop(client, None) or deque()
        mine.append(now_s)
        self._by_client[client] = self._trim(mine, now_s)
        while len(self._by_client) > _CLIENTS_KEPT:
            self._by_client.popitem(last=False)
        self._all.append(now_s)
        self._trim(self._all, now_s)

    def succeeded(self, client: str) -> None:
        self._by_client.pop(client, None)


__all__ = ["FAILURE_WINDOW_S", "MAX_FAILURES", "MAX_FAILURES_ALL", "LoginThrottle",
           "Session", "Sessions", "fingerprint"]
