"""What the gateway holds for its lifetime: settings, the declared types, one warm
client, the stats sampler, the recent history, the metrics registry, the hosts it answers to and the
dashboard's sessions."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel

from stream_jobs.client import JobClient
from stream_jobs.gateway.metrics import HistoryCollector, StatsCollector
from stream_jobs.gateway.origins import AllowedHosts
from stream_jobs.gateway.recent import RecentHistory
from stream_jobs.gateway.sampler import StatsSampler
from stream_jobs.gateway.sessions import LoginThrottle, Session, Sessions, fingerprint
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.settings import Settings
from stream_jobs.waiting import DeadJobs

# The dashboard's session cookie: a random key into the gateway's sessions (sessions.py).
SESSION_COOKIE = "sj_session"


class Enqueuer:
    """One `JobClient` for the gateway's lifetime, started on first need.

    A gateway started while Kafka is down still starts; each enqueue then tries to
    connect (one attempt, no waiting) and answers 503 until a broker answers."""

    def __init__(self, settings: Settings, types: Mapping[str, JobTypePolicy],
                 models: Mapping[str, type[BaseModel]]) -> None:
        self._settings = settings
        self._types = dict(types)
        self._models = dict(models)
        self._client: JobClient | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> JobClient:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                client = JobClient(self._settings, self._types, models=self._models)
                await client.__aenter__()  # raises BrokerUnavailable and kin
                self._client = client
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.__aexit__(None, None, None)


@dataclass
class Gateway:
    settings: Settings
    types: dict[str, JobTypePolicy]
    enqueuer: Enqueuer
    sampler: StatsSampler
    recent: RecentHistory
    require_token: bool = True
    allowed_hosts: AllowedHosts = field(default_factory=AllowedHosts.anything)
    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=False))
    sessions: Sessions = field(default_factory=Sessions)
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    # The dead jobs' page reads only the letters dead-lettered since its last reading.
    dead_jobs: DeadJobs = field(default_factory=DeadJobs)

    def __post_init__(self) -> None:
        self.registry.register(StatsCollector(lambda: self.sampler.latest,
                                              lambda: self.sampler.tenants))
        self.registry.register(HistoryCollector(lambda: self.recent.totals))
        self.enqueued = Counter("stream_jobs_gateway_enqueued", "Jobs the gateway enqueued "
                                "(acknowledged by the broker).", ["type"], registry=self.registry)
        self.requests = Counter("stream_jobs_gateway_requests", "Requests the gateway "
                                "answered, by route and status.", ["route", "status"],
                                registry=self.registry)

    def token_matches(self, given: str) -> bool:
        """Constant-time comparison with the configured token (False without one)."""
        token = self.settings.gateway_token
        if token is None:
            return False
        return hmac.compare_digest(given.encode(), token.get_secret_value().encode())

    def _token_fingerprint(self) -> str | None:
        token = self.settings.gateway_token
        return None if token is None else fingerprint(token.get_secret_value())

    def sign_in(self) -> Session | None:
        """A new session for the configured token (None without one)."""
        current = self._token_fingerprint()
        if current is None:
            return None
        return self.sessions.start(current, time.monotonic())

    def session_of(self, session_id: str | None) -> Session | None:
        """The session a request's cookie names, or None when it is not signed in; with
        --no-auth, the process's anonymous session (it carries the forms' CSRF token)."""
        if not self.require_token:
            return self.sessions.anonymous
        return self.sessions.find(session_id, self._token_fingerprint(), time.monotonic())


async def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


__all__ = ["SESSION_COOKIE", "Enqueuer", "Gateway", "gateway_of"]
