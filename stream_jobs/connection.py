"""How every Kafka client of ours connects: bootstrap servers, timeouts, TLS and SASL.

The producer, the consumers and the admin client all take `**kafka_client_kwargs(settings)`,
so a cluster that needs credentials needs them set once, in `STREAM_JOBS_KAFKA_*`.
"""

from __future__ import annotations

import ssl
from typing import Any

from aiokafka.helpers import create_ssl_context

from stream_jobs.errors import BrokerUnavailable, ConfigError
from stream_jobs.settings import Settings

_TLS = ("SSL", "SASL_SSL")
_SASL = ("SASL_PLAINTEXT", "SASL_SSL")


def kafka_client_kwargs(settings: Settings, *, client_id: str | None = None) -> dict[str, Any]:
    """Keyword arguments that AIOKafkaProducer, AIOKafkaConsumer and AIOKafkaAdminClient
    all accept. Raises ConfigError when the security settings are incomplete or unreadable.
    """
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "request_timeout_ms": settings.kafka_request_timeout_ms,
        "security_protocol": settings.kafka_security_protocol,
    }
    if client_id is not None:
        kwargs["client_id"] = client_id
    protocol = settings.kafka_security_protocol
    if protocol in _SASL:
        kwargs.update(_sasl_kwargs(settings))
    elif settings.kafka_sasl_mechanism is not None:
        raise ConfigError(
            f"STREAM_JOBS_KAFKA_SASL_MECHANISM is set but STREAM_JOBS_KAFKA_SECURITY_PROTOCOL "
            f"is {protocol}; use SASL_SSL (or SASL_PLAINTEXT) for SASL to be used."
        )
    if protocol in _TLS:
        kwargs["ssl_context"] = _ssl_context(settings)
    return kwargs


def _sasl_kwargs(settings: Settings) -> dict[str, Any]:
    missing = [
        name
        for name, value in (
            ("STREAM_JOBS_KAFKA_SASL_MECHANISM", settings.kafka_sasl_mechanism),
            ("STREAM_JOBS_KAFKA_SASL_USERNAME", settings.kafka_sasl_username),
            ("STREAM_JOBS_KAFKA_SASL_PASSWORD", settings.kafka_sasl_password),
        )
        if value is None
    ]
    if missing:
        raise ConfigError(
            f"STREAM_JOBS_KAFKA_SECURITY_PROTOCOL is {settings.kafka_security_protocol}, "
            f"which needs {', '.join(missing)} as well."
        )
    password = settings.kafka_sasl_password
    return {
        "sasl_mechanism": settings.kafka_sasl_mechanism,
        "sasl_plain_username": settings.kafka_sasl_username,
        "sasl_plain_password": password.get_secret_value() if password else None,
    }


def _ssl_context(settings: Settings) -> ssl.SSLContext:
    if settings.kafka_ssl_keyfile is not None and settings.kafka_ssl_certfile is None:
        raise ConfigError(
            "STREAM_JOBS_KAFKA_SSL_KEYFILE is set without STREAM_JOBS_KAFKA_SSL_CERTFILE; "
            "a client key needs its certificate."
        )
    key_password = settings.kafka_ssl_key_password
    try:
        # Without a CA file, the system's trusted CAs verify the broker.
        context: ssl.SSLContext = create_ssl_context(
            cafile=settings.kafka_ssl_cafile,
            certfile=settings.kafka_ssl_certfile,
            keyfile=settings.kafka_ssl_keyfile,
            password=key_password.get_secret_value() if key_password else None,
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            "Cannot load the TLS files in STREAM_JOBS_KAFKA_SSL_CAFILE / _CERTFILE / _KEYFILE: "
            f"{exc}."
        ) from exc
    return context


def broker_unavailable(settings: Settings, exc: BaseException) -> BrokerUnavailable:
    """The error to raise (`from exc`) when no broker answers at the bootstrap servers."""
    # aiokafka's bootstrap message lists resolved socket tuples; the cause is simpler.
    bootstrap_failed = "Unable to bootstrap" in str(exc)
    reason = "could not connect" if bootstrap_failed else str(exc) or type(exc).__name__
    return BrokerUnavailable(
        f"No Kafka broker answered at {settings.kafka_bootstrap} "
        f"(STREAM_JOBS_KAFKA_BOOTSTRAP): {reason}. Is Kafka running? "
        "Locally, `stream-jobs dev up` starts one."
    )
