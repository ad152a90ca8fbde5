"""Secrets in settings and in the errors about them: shown as stars, never as themselves.

The broker-side half (logs, CLI output, a real refusal) is in
tests/integration/test_security.py.
"""

from __future__ import annotations

import ssl
import traceback
from pathlib import Path

import pytest
from pydantic import SecretStr

from stream_jobs.errors import ConfigError, StackError
from stream_jobs.kafka.connection import (
    _certificate_refused,
    _credentials_refused,
    access_denied,
    kafka_client_kwargs,
)
from stream_jobs.settings import Settings, load_settings
from stream_jobs.stack.secure import ScramTls

CANARY = "canary-3b1f9e-password"
KEY_CANARY = "canary-77aa01-keypass"


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_JOBS_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("STREAM_JOBS_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("STREAM_JOBS_KAFKA_SASL_USERNAME", "alice")
    monkeypatch.setenv("STREAM_JOBS_KAFKA_SASL_PASSWORD", CANARY)
    monkeypatch.setenv("STREAM_JOBS_KAFKA_SSL_KEY_PASSWORD", KEY_CANARY)


def _shown(*texts: str) -> None:
    for text in texts:
        assert CANARY not in text
        assert KEY_CANARY not in text


def test_passwords_from_the_environment_never_show(secret_env: None) -> None:
    settings = load_settings()
    assert settings.kafka_sasl_password is not None
    assert settings.kafka_sasl_password.get_secret_value() == CANARY
    _shown(repr(settings), str(settings), str(settings.model_dump()),
           settings.model_dump_json(), f"{settings!r} {settings}")


def test_a_bad_setting_beside_a_password_does_not_print_the_password(
    secret_env: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STREAM_JOBS_KAFKA_REQUEST_TIMEOUT_MS", "-5")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "STREAM_JOBS_KAFKA_REQUEST_TIMEOUT_MS" in str(caught.value)
    _shown("".join(traceback.format_exception(caught.value)))


def test_incomplete_sasl_settings_name_what_is_missing_not_what_is_set() -> None:
    settings = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="SCRAM-SHA-512",
                        kafka_sasl_password=SecretStr(CANARY))
    with pytest.raises(ConfigError) as caught:
        kafka_client_kwargs(settings)
    assert "STREAM_JOBS_KAFKA_SASL_USERNAME" in str(caught.value)
    _shown(str(caught.value))


def test_refusals_name_the_user_and_the_settings_never_the_password() -> None:
    settings = Settings(kafka_bootstrap="k1:9093", kafka_security_protocol="SASL_SSL",
                        kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="alice",
                        kafka_sasl_password=SecretStr(CANARY),
                        kafka_ssl_cafile=Path("/etc/ca.pem"))
    refused = str(_credentials_refused(settings, "k1:9093"))
    assert refused == (
        "Kafka at k1:9093 refused the credentials of user 'alice' "
        "(STREAM_JOBS_KAFKA_SASL_USERNAME, SCRAM-SHA-512): check "
        "STREAM_JOBS_KAFKA_SASL_PASSWORD and that the user exists for that mechanism.")
    denied = str(access_denied(settings, "read jobs.a in consumer group jobs.a.worker"))
    assert denied.startswith("Kafka's ACLs do not let user 'alice' "
                             "(STREAM_JOBS_KAFKA_SASL_USERNAME) read jobs.a")
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_message = "unable to get local issuer certificate"
    unverified = str(_certificate_refused(settings, "k1:9093", verify))
    assert "STREAM_JOBS_KAFKA_SSL_CAFILE (/etc/ca.pem)" in unverified
    assert "unable to get local issuer certificate" in unverified
    for sentence in (refused, denied, unverified):
        assert sentence.endswith(".")
        assert "\n" not in sentence
        _shown(sentence)


def test_stack_users_hide_their_passwords_until_the_format_tool_needs_them() -> None:
    security = ScramTls(users={"alice": SecretStr(CANARY)}, super_users=("alice",))
    _shown(repr(security), str(security))
    assert f'password="{CANARY}"' in " ".join(security.format_args())


@pytest.mark.parametrize("password", ["", 'with"quote', "a,b", "x]y", "sp ace"])
def test_stack_passwords_that_the_format_tool_cannot_take_are_refused(password: str) -> None:
    with pytest.raises(StackError):
        ScramTls(users={"alice": SecretStr(password)})


def test_stack_tool_output_is_redacted() -> None:
    security = ScramTls(users={"alice": SecretStr(CANARY)})
    text = f"Invalid argument SCRAM-SHA-512=[name=alice,password=\"{CANARY}\"]"
    assert security.redact(text) == ('Invalid argument SCRAM-SHA-512=[name=alice,'
                                     'password="**********"]')
