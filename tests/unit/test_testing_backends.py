"""stream_jobs.testing's pure parts: which backend an environment asks for, the TOML a
declared type is written as, and the images the testcontainers backend runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.errors import ConfigError
from stream_jobs.stack.kafka import kafka_version
from stream_jobs.testing.containers import (
    DEFAULT_KAFKA_IMAGE,
    DEFAULT_POSTGRES_IMAGE,
    KAFKA_VERSION,
    ContainerImages,
    images_from,
    start_failure,
)
from stream_jobs.testing.stack import choose_backend, toml_lines

REPO = Path(__file__).resolve().parents[2]
KAFKA = "STREAM_JOBS_KAFKA_BOOTSTRAP"
DB = "STREAM_JOBS_DATABASE_URL"
BACKEND = "STREAM_JOBS_TEST_BACKEND"
BOTH = {KAFKA: "k:9092", DB: "postgresql://u@h/d"}


@pytest.mark.parametrize(("environ", "backend"), [
    ({}, "local"),
    (BOTH, "external"),
    ({BACKEND: "local"}, "local"),
    ({BACKEND: "local", **BOTH}, "local"),
    ({BACKEND: "testcontainers"}, "testcontainers"),
    # The services named in the environment do not stop a run on containers.
    ({BACKEND: "testcontainers", KAFKA: "k:9092"}, "testcontainers"),
    ({BACKEND: " External ", **BOTH}, "external"),
    ({BACKEND: "", **BOTH}, "external"),
])
def test_the_backend_the_environment_asks_for(environ: dict[str, str], backend: str) -> None:
    assert choose_backend(environ) == backend


@pytest.mark.parametrize(("environ", "says"), [
    ({KAFKA: "k:9092"}, f"{KAFKA} is set but {DB} is not"),
    ({DB: "postgresql://u@h/d"}, f"{DB} is set but {KAFKA} is not"),
    ({BACKEND: "external"}, "set both"),
    ({BACKEND: "external", DB: "postgresql://u@h/d"}, f"{DB} is set but {KAFKA} is not"),
    ({BACKEND: "docker"}, "choose local, testcontainers or external"),
])
def test_a_contradiction_is_one_sentence(environ: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        choose_backend(environ)
    assert says in str(raised.value)
    assert str(raised.value).count(". ") == 0  # one sentence


keys = st.dictionaries(
    st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True),
    st.one_of(st.integers(-10**6, 10**6), st.text(max_size=20), st.booleans(),
              st.lists(st.text(max_size=8), max_size=4)),
    max_size=6)


@given(keys)
def test_declared_keys_read_back_as_toml(declared: dict[str, object]) -> None:
    assert tomllib.loads(toml_lines(declared)) == declared


def test_the_default_kafka_image_is_the_broker_we_pin() -> None:
    assert kafka_version(REPO / "ops" / "kafka" / "pom.xml") == KAFKA_VERSION
    assert f"apache/kafka:{KAFKA_VERSION}" == DEFAULT_KAFKA_IMAGE


def test_images_come_from_the_environment_or_the_defaults() -> None:
    assert images_from({}) == ContainerImages(DEFAULT_KAFKA_IMAGE, DEFAULT_POSTGRES_IMAGE)
    assert images_from({"STREAM_JOBS_TEST_KAFKA_IMAGE": "apache/kafka:4.2.0",
                        "STREAM_JOBS_TEST_POSTGRES_IMAGE": ""}) == \
        ContainerImages("apache/kafka:4.2.0", DEFAULT_POSTGRES_IMAGE)


@pytest.mark.parametrize(("error", "says"), [
    ("500 Server Error for .../images/create?tag=0.8.1&fromImage=testcontainers%2Fryuk",
     "set TESTCONTAINERS_RYUK_DISABLED=true"),
    ("404 Client Error for .../images/create?fromImage=apache%2Fkafka: not found",
     "name others with STREAM_JOBS_TEST_KAFKA_IMAGE"),
    ("Container did not emit logs", "did not start: Container did not emit logs"),
])
def test_a_container_that_did_not_start_says_what_to_do(error: str, says: str) -> None:
    assert says in start_failure(RuntimeError(error.replace("%2F", "/")), ContainerImages())
