"""Does the configured Kafka answer, and the configured Postgres? Used by `stream-jobs dev check`.

Each probe returns what answered or raises `BrokerUnavailable` / `DatabaseUnavailable` (or,
for a broker that answered but not to our security settings, `AuthenticationFailed` /
`ConfigError`) with one sentence naming the setting, its value and what to do. Driver
errors stop here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from stream_jobs.errors import BrokerUnavailable, DatabaseUnavailable, StreamJobsError
from stream_jobs.kafka.admin import open_admin
from stream_jobs.kafka.connection import security_problem
from stream_jobs.postgres.pool import DRIVER_ERRORS, connect
from stream_jobs.redaction import redact_text, redact_url
from stream_jobs.settings import Settings

PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Answer:
    """A service that answered a probe: where, and what it said about itself."""

    service: str
    address: str
    detail: str


async def probe_kafka(settings: Settings, timeout_s: float = PROBE_TIMEOUT_S) -> Answer:
    """Fetch cluster metadata from `STREAM_JOBS_KAFKA_BOOTSTRAP` within `timeout_s`."""
    bootstrap = settings.kafka_bootstrap
    try:
        with _quiet("aiokafka"):
            async with asyncio.timeout(timeout_s), open_admin(
                    settings, client_id="stream-jobs-probe",
                    request_timeout_ms=int(timeout_s * 1000)) as admin:
                brokers, cluster_id = await admin.cluster()
    except (StreamJobsError, OSError, TimeoutError) as exc:
        with _quiet("aiokafka"):
            problem = await security_problem(settings)
        if problem is not None:  # it answered, but not to our security settings
            raise problem from exc
        raise BrokerUnavailable(
            f"No Kafka broker answered at {bootstrap} (STREAM_JOBS_KAFKA_BOOTSTRAP): start one "
            "with `stream-jobs dev up` or fix the setting."
        ) from exc
    plural = "s" if brokers != 1 else ""
    return Answer(service="kafka", address=bootstrap,
                  detail=f"{brokers} broker{plural}, cluster {cluster_id}")


async def probe_postgres(settings: Settings, timeout_s: float = PROBE_TIMEOUT_S) -> Answer:
    """Connect to `STREAM_JOBS_DATABASE_URL` and ask the server's version within `timeout_s`."""
    shown = redact_url(settings.database_url)
    try:
        async with asyncio.timeout(timeout_s):
            conn = await connect(settings, timeout_s=timeout_s, in_schema=False)
            try:
                version = await conn.fetchval("SHOW server_version")
            finally:
                await conn.close()
    except (OSError, TimeoutError) as exc:
        raise DatabaseUnavailable(
            f"No Postgres server answered at {shown} (STREAM_JOBS_DATABASE_URL): start one with "
            "`stream-jobs dev up` or fix the setting."
        ) from exc
    except DRIVER_ERRORS as exc:  # answered, and refused us
        reason = redact_text((str(exc).splitlines() or [type(exc).__name__])[0].rstrip("."),
                             settings)
        raise DatabaseUnavailable(
            f"The Postgres server at {shown} (STREAM_JOBS_DATABASE_URL) refused us ({reason}): "
            "fix the user, password or database in the setting."
        ) from exc
    return Answer(service="postgres", address=shown, detail=f"PostgreSQL {version}")


async def probe_stack(
    settings: Settings, timeout_s: float = PROBE_TIMEOUT_S
) -> list[Answer | StreamJobsError]:
    """Probe Kafka and Postgres at once; each item is the answer or the error that says why not.

    Both are reported so a user fixes both settings in one go, not one per run.
    """
    outcomes = await asyncio.gather(
        probe_kafka(settings, timeout_s), probe_postgres(settings, timeout_s),
        return_exceptions=True,
    )
    results: list[Answer | StreamJobsError] = []
    for outcome in outcomes:
        if isinstance(outcome, Answer | StreamJobsError):
            results.append(outcome)
        else:
            raise outcome
    return results


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    # The driver logs every refused bootstrap at ERROR; the probe turns that failure into
    # one sentence of its own, and two reports of one problem read like two problems.
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
