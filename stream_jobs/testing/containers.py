"""The `testcontainers` backend: Kafka (KRaft) and Postgres in containers for a test run.

Both are testcontainers' own modules: `PostgresContainer` as it is, and its
`KafkaContainer` (listeners, KRaft settings, the advertised address written once the
mapped port is known, the wait for "Kafka Server started") on the official `apache/kafka`
image. That module was written for Confluent's image, and two of its steps name that
image's files and version scheme; `ApacheKafkaContainer` replaces just those two, the way
testcontainers' Java module for apache/kafka starts it.

Images: `STREAM_JOBS_TEST_KAFKA_IMAGE` (default `apache/kafka:<the version we pin>`) and
`STREAM_JOBS_TEST_POSTGRES_IMAGE` (default `postgres:15`). testcontainers' own settings
apply as usual: `DOCKER_HOST`, `TESTCONTAINERS_RYUK_DISABLED`, `TC_HOST`,
`TESTCONTAINERS_CONNECTION_MODE`. Needs the `testcontainers` package
(`pip install 'stream-jobs[testcontainers]'`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stream_jobs.errors import PrerequisiteMissing, StackError
from stream_jobs.testing.stack import TestStack

if TYPE_CHECKING:
    from testcontainers.community.kafka import KafkaContainer
    from testcontainers.community.postgres import PostgresContainer

# The broker version ops/kafka/pom.xml pins for `stream-jobs dev up` (a unit test keeps
# the two equal), so tests run on the broker the project is developed against.
KAFKA_VERSION = "4.4.0"
KAFKA_IMAGE_ENV = "STREAM_JOBS_TEST_KAFKA_IMAGE"
POSTGRES_IMAGE_ENV = "STREAM_JOBS_TEST_POSTGRES_IMAGE"
DEFAULT_KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
DEFAULT_POSTGRES_IMAGE = "postgres:15"
DATABASE = "stream_jobs"
START_TIMEOUT_S = 180
RYUK = "testcontainers/ryuk"

# What our local stack sets too: topics exist only when declared, room for a 1 MiB
# payload, and a single node's replication. The heap stays small beside the tests.
KAFKA_ENV = {
    "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    "KAFKA_MESSAGE_MAX_BYTES": "2097152",
    "KAFKA_REPLICA_FETCH_MAX_BYTES": "2097152",
    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
    "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
    "KAFKA_HEAP_OPTS": "-Xms256m -Xmx512m",
}


@dataclass(frozen=True)
class ContainerImages:
    """The images the testcontainers backend runs."""

    kafka: str = DEFAULT_KAFKA_IMAGE
    postgres: str = DEFAULT_POSTGRES_IMAGE


def images_from(environ: Mapping[str, str]) -> ContainerImages:
    return ContainerImages(
        kafka=environ.get(KAFKA_IMAGE_ENV) or DEFAULT_KAFKA_IMAGE,
        postgres=environ.get(POSTGRES_IMAGE_ENV) or DEFAULT_POSTGRES_IMAGE,
    )


def docker_unavailable() -> str | None:
    """Why the backend cannot run here (no testcontainers, no engine), or None if it can."""
    try:
        import docker
        import testcontainers  # noqa: F401
    except ImportError:
        return ("the testcontainers backend needs the testcontainers package: "
                "pip install 'stream-jobs[testcontainers]'.")
    try:
        client = docker.from_env()
        try:
            client.ping()
        finally:
            client.close()
    except docker.errors.DockerException as exc:
        return (f"the testcontainers backend needs a Docker engine and none answers "
                f"({exc}): start Docker or point DOCKER_HOST at one.")
    return None


def kafka_container(image: str) -> KafkaContainer:
    """testcontainers' KafkaContainer for `image` (apache/kafka's, or a Confluent image),
    in KRaft mode, with our broker settings."""
    from testcontainers.community.kafka import KafkaContainer

    class ApacheKafkaContainer(KafkaContainer):
        """KafkaContainer on the apache/kafka image (KRaft only, as Kafka 4 is)."""

        def _verify_min_kraft_version(self) -> None:
            # The module checks a Confluent Platform version (7.0+); apache/kafka's tags
            # are Kafka versions, and every one of them runs KRaft.
            return None

        def tc_start(self) -> None:
            # The module's script runs Confluent's /etc/confluent/docker/*; apache/kafka
            # starts with /etc/kafka/docker/run, from the same KAFKA_* variables.
            host = self.get_container_host_ip()
            port = self.get_exposed_port(self.port)
            listeners = (f"{self.listener_name}://{host}:{port},"
                         "BROKER://$(hostname -i | cut -d' ' -f1):9092")
            script = ("#!/bin/bash\n"
                      f"export KAFKA_ADVERTISED_LISTENERS={listeners}\n"
                      "exec /etc/kafka/docker/run\n")
            self.create_file(script.encode(), KafkaContainer.TC_START_SCRIPT)

    # Confluent's images are the ones the module was written for: it runs them as it is.
    kind = KafkaContainer if "confluentinc/" in image else ApacheKafkaContainer
    container = kind(image).with_kraft()
    for name, value in KAFKA_ENV.items():
        container.with_env(name, value)
    return container


def postgres_container(image: str) -> PostgresContainer:
    from testcontainers.community.postgres import PostgresContainer

    return PostgresContainer(image, username=DATABASE, password=secrets.token_hex(12),
                             dbname=DATABASE, driver=None)


def start_failure(exc: BaseException, images: ContainerImages) -> str:
    """The sentence for a container that did not start: what to set or get."""
    if RYUK in str(exc):
        return (f"testcontainers' clean-up container ({RYUK}) could not be started or pulled "
                f"({exc}): set TESTCONTAINERS_RYUK_DISABLED=true, the fixtures remove their "
                "containers themselves.")
    if "images/create" in str(exc) or "not found" in str(exc).lower():
        return (f"A test image is missing and could not be pulled ({exc}): pull or build "
                f"{images.kafka} and {images.postgres}, or name others with "
                f"{KAFKA_IMAGE_ENV} / {POSTGRES_IMAGE_ENV}.")
    return f"The test containers ({images.kafka}, {images.postgres}) did not start: {exc}."


@contextmanager
def containers_stack(images: ContainerImages | None = None) -> Iterator[TestStack]:
    """Start Kafka and Postgres containers; the stack they make, until the block ends."""
    try:
        import docker.errors
        from testcontainers.core.exceptions import ContainerStartException
    except ImportError as exc:
        raise PrerequisiteMissing("The testcontainers backend needs the testcontainers "
                                  "package: pip install 'stream-jobs[testcontainers]'.") from exc
    images = images or ContainerImages()
    with ExitStack() as running:
        try:
            kafka = kafka_container(images.kafka)
            running.callback(kafka.stop)
            kafka.start(timeout=START_TIMEOUT_S)
            postgres = postgres_container(images.postgres)
            running.callback(postgres.stop)
            postgres.start()
            stack = TestStack(kafka.get_bootstrap_server(),
                              postgres.get_connection_url(driver=None), "testcontainers")
        except (docker.errors.DockerException, ContainerStartException, TimeoutError) as exc:
            raise StackError(start_failure(exc, images)) from exc
        yield stack


__all__ = [
    "DEFAULT_KAFKA_IMAGE",
    "DEFAULT_POSTGRES_IMAGE",
    "KAFKA_VERSION",
    "ContainerImages",
    "containers_stack",
    "docker_unavailable",
    "images_from",
]
