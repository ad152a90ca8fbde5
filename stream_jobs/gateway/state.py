"""What the gateway holds for its lifetime: settings, the declared types, one warm
client, the stats sampler and the metrics registry."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel

from stream_jobs.client import JobClient
from stream_jobs.gateway.metrics import StatsCollector
from stream_jobs.gateway.sampler import StatsSampler
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.settings import Settings

# The dashboard's session cookie holds a MAC of the token, never the token itself.
SESSION_COOKIE = "sj_session"
_SESSION_CONTEXT = b"stream-jobs dashboard session v1"


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
    require_token: bool = True
    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=False))

    def __post_init__(self) -> None:
        self.registry.register(StatsCollector(lambda: self.sampler.latest))
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

    def session_value(self) -> str | None:
        token = self.settings.gateway_token
        if token is None:
            return None
        return hmac.new(token.get_secret_value().encode(), _SESSION_CONTEXT,
                        hashlib.sha256).hexdigest()

    def session_matches(self, given: str | None) -> bool:
        expected = self.session_value()
        if not self.require_token:
            return True
        if expected is None or given is None:
            return False
        return hmac.compare_digest(given.encode(), expected.encode())


async def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


__all__ = ["SESSION_COOKIE", "Enqueuer", "Gateway", "gateway_of"]
