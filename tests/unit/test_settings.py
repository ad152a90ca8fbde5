from __future__ import annotations

import pytest

from stream_jobs.errors import ConfigError
from stream_jobs.settings import Settings, load_settings


def test_defaults_point_at_the_local_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KAFKA_BOOTSTRAP", "DATABASE_URL", "TOPIC_PREFIX", "TOPICS_DIR"):
        monkeypatch.delenv(f"STREAM_JOBS_{name}", raising=False)
    settings = Settings()
    assert settings.kafka_bootstrap == "127.0.0.1:9092"
    assert settings.topic_prefix == "jobs"
    assert settings.database_url.startswith("postgresql://")


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_JOBS_TOPIC_PREFIX", "staging")
    monkeypatch.setenv("STREAM_JOBS_KAFKA_BOOTSTRAP", "a:1, b:2")
    settings = load_settings()
    assert settings.topic_prefix == "staging"
    assert settings.bootstrap_servers == ["a:1", "b:2"]


def test_explicit_overrides_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_JOBS_TOPIC_PREFIX", "staging")
    assert load_settings(topic_prefix="prod").topic_prefix == "prod"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kafka_bootstrap", "localhost"),
        ("kafka_bootstrap", "localhost:notaport"),
        ("database_url", "mysql://x"),
        ("topic_prefix", "bad prefix"),
        ("database_schema", "1schema"),
    ],
)
def test_bad_values_give_one_clear_sentence(field: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"STREAM_JOBS_{field.upper()}"):
        load_settings(**{field: value})


def test_secrets_are_not_shown() -> None:
    settings = load_settings(kafka_sasl_password="hunter2-canary")
    assert "hunter2-canary" not in repr(settings)
    assert "hunter2-canary" not in str(settings.model_dump())
