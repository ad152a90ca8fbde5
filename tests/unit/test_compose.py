"""docker-compose.yml agrees with the code: ports, settings names, Kafka version, build files.

The file as compose reads it with no variables set (`${VAR:-default}` gives the default).
`make compose-check` runs it for real where a Docker engine is; these checks run
everywhere, so the file cannot drift away from stream_jobs.settings and ops/ unseen.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry

from stream_jobs.runtime.metrics import serve_metrics, worker_registry
from stream_jobs.runtime.throttle import NO_LIMIT
from stream_jobs.settings import DEFAULT_KAFKA_PORT, DEFAULT_POSTGRES_PORT, Settings
from stream_jobs.stack.kafka import KafkaCluster, kafka_version
from stream_jobs.testing.containers import KAFKA_ENV

REPO = Path(__file__).resolve().parents[2]
PREFIX = "STREAM_JOBS_"


def interpolated(text: str, environ: dict[str, str] | None = None) -> str:
    """`text` with `${VAR:-default}` replaced as compose does: VAR's value, else the default."""
    given = environ or {}
    return re.sub(r"\$\{([A-Z0-9_]+):-([^}]*)\}",
                  lambda m: given.get(m.group(1)) or m.group(2), text)


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    compose = yaml.safe_load(interpolated((REPO / "docker-compose.yml").read_text()))
    found: dict[str, Any] = compose["services"]
    return found


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) for each published port, short or long syntax."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((str(port.get("host_ip", "0.0.0.0")), int(port["published"]),
                        int(port["target"])))
            continue
        parts = str(port).split(":")
        if len(parts) == 3:
            out.append((parts[0], int(parts[1]), int(parts[2])))
        elif len(parts) == 2:
            out.append(("0.0.0.0", int(parts[0]), int(parts[1])))
    return out


def default_of(field: str) -> str:
    # The field's declared default, not Settings(), so a developer's environment can't leak in.
    return str(Settings.model_fields[field].default)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_the_stack_and_a_worker_are_declared(services: dict[str, Any]) -> None:
    assert {"kafka", "postgres", "worker"} <= set(services)


@pytest.mark.parametrize("name", ["kafka", "postgres", "worker"])
def test_each_service_has_a_healthcheck(services: dict[str, Any], name: str) -> None:
    check = services[name].get("healthcheck")
    assert check, f"{name} has no healthcheck"
    assert check["test"], f"{name}'s healthcheck runs nothing"


def test_kafka_is_published_where_the_default_bootstrap_points(services: dict[str, Any]) -> None:
    host, _, port = default_of("kafka_bootstrap").rpartition(":")
    assert int(port) == DEFAULT_KAFKA_PORT
    assert (host, DEFAULT_KAFKA_PORT, DEFAULT_KAFKA_PORT) in published(services["kafka"])
    # A client on the host is sent back to the address it bootstrapped from.
    advertised = environment(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    assert f"//{host}:{DEFAULT_KAFKA_PORT}" in advertised


def test_a_moved_kafka_port_is_the_port_kafka_advertises() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    moved = yaml.safe_load(interpolated(text, {"STREAM_JOBS_COMPOSE_KAFKA_PORT": "39092",
                                               "STREAM_JOBS_COMPOSE_POSTGRES_PORT": "39432"}))
    kafka, postgres = moved["services"]["kafka"], moved["services"]["postgres"]
    assert ("127.0.0.1", 39092, DEFAULT_KAFKA_PORT) in published(kafka)
    assert "HOST://127.0.0.1:39092" in environment(kafka)["KAFKA_ADVERTISED_LISTENERS"]
    assert ("127.0.0.1", 39432, 5432) in published(postgres)


def test_postgres_is_published_where_the_default_url_points(services: dict[str, Any]) -> None:
    url = urlsplit(default_of("database_url"))
    assert url.port == DEFAULT_POSTGRES_PORT
    assert (url.hostname, DEFAULT_POSTGRES_PORT, 5432) in published(services["postgres"])
    env = environment(services["postgres"])
    assert env["POSTGRES_USER"] == url.username
    assert env["POSTGRES_DB"] == url.path.lstrip("/")


def test_the_kafka_image_is_the_version_dev_up_runs(services: dict[str, Any]) -> None:
    image = services["kafka"]["image"]
    assert image == f"apache/kafka:{kafka_version(REPO / 'ops' / 'kafka' / 'pom.xml')}"


# The internal topics a single node must place with one replica: the transaction state
# log above all (a transactional producer, an exactly-once stream processor's, never gets a
# producer ID on one node without it), the consumer offsets, and the share groups' state.
SINGLE_NODE_SETTINGS = (
    "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
    "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.min.isr",
)


def as_variable(setting: str) -> str:
    return "KAFKA_" + setting.upper().replace(".", "_")


def dev_up_settings(tmp_path: Path) -> dict[str, str]:
    cluster = KafkaCluster(Settings(stack_dir=tmp_path), 1)
    lines = cluster._render_config(cluster.nodes[0]).splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_every_single_node_broker_places_its_internal_topics_on_one_node(
        services: dict[str, Any], tmp_path: Path) -> None:
    dev_up = dev_up_settings(tmp_path)
    compose = environment(services["kafka"])
    for setting in SINGLE_NODE_SETTINGS:
        assert dev_up[setting] == "1", setting
        assert compose.get(as_variable(setting)) == "1", f"docker-compose.yml: {setting}"
        # testcontainers' KafkaContainer sets the offsets topic's itself.
        if setting != "offsets.topic.replication.factor":
            assert KAFKA_ENV.get(as_variable(setting)) == "1", f"containers.py: {setting}"


def test_worker_environment_names_real_settings(services: dict[str, Any]) -> None:
    env = environment(services["worker"])
    assert env, "the worker sets no STREAM_JOBS_* settings"
    fields = {f"{PREFIX}{name.upper()}": name for name in Settings.model_fields}
    unknown = sorted(set(env) - set(fields))
    assert not unknown, f"not settings: {unknown}"
    # The values must also pass the settings' own validation.
    Settings(**{fields[key]: value for key, value in env.items()})


def test_worker_reaches_the_stack_from_inside_the_network(services: dict[str, Any]) -> None:
    env = environment(services["worker"])
    advertised = environment(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    for server in env[f"{PREFIX}KAFKA_BOOTSTRAP"].split(","):
        assert f"//{server}" in advertised, f"{server} is not an advertised listener"
    url = urlsplit(env[f"{PREFIX}DATABASE_URL"])
    assert (url.hostname, url.port) == ("postgres", 5432)


def test_worker_waits_for_a_healthy_stack(services: dict[str, Any]) -> None:
    depends = services["worker"]["depends_on"]
    for name in ("kafka", "postgres"):
        assert depends[name]["condition"] == "service_healthy"


def test_worker_runs_the_demo_app_from_the_deploy_image(services: dict[str, Any]) -> None:
    worker = services["worker"]
    command = worker["command"]
    argv = command.split() if isinstance(command, str) else command
    assert argv == ["stream-jobs", "worker", "consumers.demo:app", "--type", "email.send"]
    build = worker["build"]
    dockerfile = REPO / build.get("context", ".") / build["dockerfile"]
    assert dockerfile == REPO / "ops" / "deploy" / "Dockerfile"
    assert dockerfile.is_file()
    assert "pip install" in dockerfile.read_text()


def worker_probe(services: dict[str, Any]) -> tuple[str, int]:
    """The worker healthcheck's Python program and the metrics port it reads."""
    argv = services["worker"]["healthcheck"]["test"]
    assert argv[:3] == ["CMD", "python", "-c"], argv
    program = argv[3]
    [port] = re.findall(r"http://127\.0\.0\.1:(\d+)/metrics", program)
    return program, int(port)


def test_worker_healthcheck_reads_the_metrics_port_the_worker_serves(
    services: dict[str, Any],
) -> None:
    _, port = worker_probe(services)
    settings = Settings(metrics_port=environment(services["worker"])[f"{PREFIX}METRICS_PORT"])
    assert settings.metrics_port == port
    # The healthcheck dials loopback inside the container, where the worker listens.
    assert default_of("metrics_host") == "127.0.0.1"


async def run_probe(program: str, port: int, served: int) -> int:
    probe = program.replace(f":{port}/", f":{served}/")
    assert probe != program
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", probe,
                                                stderr=asyncio.subprocess.DEVNULL)
    return await asyncio.wait_for(proc.wait(), timeout=30)


async def test_worker_healthcheck_passes_only_on_a_live_workers_metrics(
    services: dict[str, Any],
) -> None:
    program, port = worker_probe(services)
    worker = SimpleNamespace(
        policy=SimpleNamespace(job_type="email.send"), outcomes=Counter({"succeeded": 1}),
        dead_letter_reasons=Counter(), durations=None, in_flight=lambda: 0,
        rate=NO_LIMIT, rate_share_per_s=None, partitions={}, relay=None, threads=None,
        loop_watch=SimpleNamespace(stalls=0))
    live = await serve_metrics(worker_registry(worker), "127.0.0.1", 0)
    other = await serve_metrics(CollectorRegistry(), "127.0.0.1", 0)
    try:
        live_port = live.sockets[0].getsockname()[1]
        other_port = other.sockets[0].getsockname()[1]
        assert await run_probe(program, port, live_port) == 0
        # Something else answering on the port is not a worker.
        assert await run_probe(program, port, other_port) != 0
    finally:
        live.close()
        other.close()
        await live.wait_closed()
        await other.wait_closed()
    # Nothing listening: the worker is gone.
    assert await run_probe(program, port, live_port) != 0


def test_the_history_process_runs_beside_the_worker(services: dict[str, Any]) -> None:
    history, worker = services["history"], services["worker"]
    assert history["command"] == ["stream-jobs", "history"]
    assert history["image"] == worker["image"]
    assert history["build"] == worker["build"]
    # After setup: its `db migrate` made stream_jobs_history.
    assert history["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    for name in ("kafka", "postgres"):
        assert history["depends_on"][name]["condition"] == "service_healthy"
    assert history["restart"] in ("on-failure", "unless-stopped")  # a crash exits 1
    env = environment(history)
    fields = {f"{PREFIX}{name.upper()}": name for name in Settings.model_fields}
    assert not sorted(set(env) - set(fields)), "not settings"
    settings = Settings(**{fields[key]: value for key, value in env.items()})
    # The worker's stack and prefix; a folder the image's unprivileged user can write
    # without a volume (its state is in Kafka).
    assert {k: v for k, v in env.items() if k in environment(worker)} == {
        k: v for k, v in environment(worker).items() if k != f"{PREFIX}METRICS_PORT"}
    assert settings.history_data_dir.is_relative_to("/tmp")
