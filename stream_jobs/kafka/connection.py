"""How every Kafka client of ours connects: bootstrap servers, timeouts, TLS and SASL.

The producer, the consumers and the admin client all take `**kafka_client_kwargs(settings)`,
so a cluster that needs credentials needs them set once, in `STREAM_JOBS_KAFKA_*`. When a
client cannot start, `connect_error` says why in one sentence: no broker, refused
credentials, a certificate that does not verify, or a listener that wants SASL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.metadata import MetadataRequest

from stream_jobs.errors import (
    AccessDenied,
    AuthenticationFailed,
    BrokerUnavailable,
    ConfigError,
    StreamJobsError,
)
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
        kwargs.update(sasl_options(settings))
    elif settings.kafka_sasl_mechanism is not None:
        raise ConfigError(
            f"STREAM_JOBS_KAFKA_SASL_MECHANISM is set but STREAM_JOBS_KAFKA_SECURITY_PROTOCOL "
            f"is {protocol}; use SASL_SSL (or SASL_PLAINTEXT) for SASL to be used."
        )
    if protocol in _TLS:
        kwargs["ssl_context"] = ssl_context(settings)
    return kwargs


def sasl_options(settings: Settings) -> dict[str, Any]:
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


def ssl_context(settings: Settings) -> ssl.SSLContext:
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


def sasl_user(settings: Settings) -> str | None:
    """The SASL user Kafka knows us by, for messages; None without SASL."""
    if settings.kafka_security_protocol in _SASL and settings.kafka_sasl_username:
        return f"user {settings.kafka_sasl_username!r} (STREAM_JOBS_KAFKA_SASL_USERNAME)"
    return None


def principal(settings: Settings) -> str:
    """Who Kafka sees us as, for messages: the SASL user, or the client in general."""
    return sasl_user(settings) or "this client"


def access_denied(settings: Settings, what: str) -> AccessDenied:
    """The error to raise (`from exc`) when Kafka's authorizer refused us `what`."""
    return AccessDenied(
        f"Kafka's ACLs do not let {principal(settings)} {what}: grant the ACLs listed "
        "in docs/security.md, under ACLs per job type."
    )


async def connect_error(settings: Settings, exc: BaseException) -> StreamJobsError:
    """The error to raise (`from exc`) when a Kafka client of ours could not start.

    aiokafka reports every failed bootstrap alike ("Unable to bootstrap"), whether no
    broker answered, the broker refused our SASL credentials or its certificate did not
    verify. One more connection tells these apart, so a wrong password reads as one, not
    as a broker that is down.
    """
    problem = await security_problem(settings)
    return problem if problem is not None else broker_unavailable(settings, exc)


async def security_problem(settings: Settings) -> StreamJobsError | None:
    """Why the configured security settings keep us out of Kafka, or None.

    Connects to each bootstrap server in turn and asks it for metadata, as a client's
    start does. None means a server let us in, or none answered at all: then the problem
    is not security. Never raises for what a broker says; no message holds a password.
    """
    options = kafka_client_kwargs(settings, client_id="stream-jobs-diagnosis")
    protocol = settings.kafka_security_protocol
    # This runs after a start already failed; a host that swallows packets has had its time.
    timeout_s = min(settings.kafka_request_timeout_ms / 1000, 5.0)
    for server in settings.bootstrap_servers:
        host, _, port = server.rpartition(":")
        try:
            async with asyncio.timeout(timeout_s):
                conn = await create_conn(
                    host.strip("[]"), int(port), client_id=options["client_id"],
                    request_timeout_ms=int(timeout_s * 1000),
                    ssl_context=options.get("ssl_context"),
                    security_protocol=protocol,
                    sasl_mechanism=options.get("sasl_mechanism"),
                    sasl_plain_username=options.get("sasl_plain_username"),
                    sasl_plain_password=options.get("sasl_plain_password"),
                )
        except SaslAuthenticationFailed:
            return _credentials_refused(settings, server)
        except UnsupportedSaslMechanismError:
            return ConfigError(
                f"Kafka at {server} does not offer SASL mechanism "
                f"{settings.kafka_sasl_mechanism} (STREAM_JOBS_KAFKA_SASL_MECHANISM): use one "
                "its listener enables (sasl.enabled.mechanisms)."
            )
        except ssl.SSLCertVerificationError as verify:
            return _certificate_refused(settings, server, verify)
        except ssl.SSLError as tls:
            return AuthenticationFailed(
                f"The TLS handshake with Kafka at {server} failed ({tls.reason or tls}): check "
                "that STREAM_JOBS_KAFKA_SECURITY_PROTOCOL matches the broker's listener there."
            )
        except (OSError, KafkaError, TimeoutError):
            continue  # not answering, or answering in a way that is not about security
        try:
            async with asyncio.timeout(timeout_s):
                await conn.send(MetadataRequest([]))
        except (OSError, KafkaError, TimeoutError):
            # The listener took the handshake, then dropped the first real request: it
            # wants an authentication step this protocol does not make.
            return ConfigError(
                f"Kafka at {server} accepted our {protocol} connection and then closed it: "
                "its listener there likely needs SASL; check "
                "STREAM_JOBS_KAFKA_SECURITY_PROTOCOL and the SASL settings."
            )
        finally:
            with contextlib.suppress(Exception):
                conn.close()
        return None
    return None


def _credentials_refused(settings: Settings, server: str) -> AuthenticationFailed:
    # Kafka answers an unknown user and a wrong password alike, and so do we.
    return AuthenticationFailed(
        f"Kafka at {server} refused the credentials of user {settings.kafka_sasl_username!r} "
        f"(STREAM_JOBS_KAFKA_SASL_USERNAME, {settings.kafka_sasl_mechanism}): check "
        "STREAM_JOBS_KAFKA_SASL_PASSWORD and that the user exists for that mechanism."
    )


def _certificate_refused(settings: Settings, server: str,
                         exc: ssl.SSLCertVerificationError) -> AuthenticationFailed:
    why = (exc.verify_message or exc.reason or "not verified").rstrip(".")
    cafile = settings.kafka_ssl_cafile
    trusted = (f"the CA in STREAM_JOBS_KAFKA_SSL_CAFILE ({cafile})" if cafile is not None
               else "the system's trusted CAs (STREAM_JOBS_KAFKA_SSL_CAFILE is not set)")
    return AuthenticationFailed(
        f"The TLS certificate of Kafka at {server} did not verify against {trusted}: {why}; "
        "point the setting at the CA that signed the broker's certificate."
    )
