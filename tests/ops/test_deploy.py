"""ops/deploy agrees with topics/ and stream_jobs.naming: every file parses, names a type
that is declared, uses the contract's group and topic names, and is what render.py makes
now (so a new or changed type without re-rendered files fails here)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.naming import worker_group
from stream_jobs.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "ops" / "deploy"
TYPES: dict[str, JobTypePolicy] = load_job_types(REPO / "topics")
HISTORY = ["stream-jobs", "history"]
HISTORY_K8S = "k8s/stream-jobs-history.yaml"
HISTORY_SYSTEMD = "systemd/stream-jobs-history.service"


@pytest.fixture(scope="module")
def render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ops_deploy_render", DEPLOY / "render.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ops_deploy_render"] = module
    spec.loader.exec_module(module)
    return module


def type_of(command: list[str]) -> str:
    assert command[:2] == ["stream-jobs", "worker"], command
    return command[command.index("--type") + 1]


def test_the_committed_files_are_what_render_makes(render: ModuleType) -> None:
    assert render.main(["--check"]) == 0, "run: .venv/bin/python ops/deploy/render.py"


def test_the_rendered_files_follow_the_types(render: ModuleType) -> None:
    files = render.render(TYPES, render.Options())
    fixed = {"k8s/config.yaml", HISTORY_K8S}
    assert {p for p in files if p.startswith("k8s/") and p not in fixed} == {
        f"k8s/{t}.yaml" for t in TYPES}
    assert {p for p in files if p.endswith(".env") and p != "systemd/stream-jobs.env"} == {
        f"systemd/{t}.env" for t in TYPES}
    assert {HISTORY_K8S, HISTORY_SYSTEMD} <= set(files)


def test_a_type_named_like_a_file_of_its_own_is_refused(render: ModuleType) -> None:
    policy = replace(next(iter(TYPES.values())), job_type="stream-jobs-history")
    with pytest.raises(SystemExit, match=f"would overwrite ops/deploy/{HISTORY_K8S}"):
        render.render({policy.job_type: policy}, render.Options())


def test_compose_has_a_service_per_type() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.workers.yml").read_text())
    seen = set()
    healthchecks = []
    for name, service in compose["services"].items():
        if name == "history":
            continue  # test_compose_runs_the_history_of_the_prefix
        job_type = type_of(service["command"])
        assert job_type in TYPES, f"{name} runs undeclared type {job_type}"
        assert service["labels"]["stream-jobs.job-type"] == job_type
        assert service["build"]["dockerfile"] == "ops/deploy/Dockerfile"
        assert (REPO / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        assert {"kafka", "postgres", "setup"} <= set(service["depends_on"])
        healthchecks.append((service["healthcheck"]["test"],
                             service["environment"]["STREAM_JOBS_METRICS_PORT"]))
        seen.add(job_type)
    assert seen == set(TYPES)
    # The stack it runs next to has the services it depends on, and its worker's probe
    # (tested against a live worker's metrics) is the one every type's service uses.
    stack = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert {"kafka", "postgres", "setup"} <= set(stack)
    probe = stack["worker"]["healthcheck"]["test"]
    port = stack["worker"]["environment"]["STREAM_JOBS_METRICS_PORT"]
    assert healthchecks == [(probe, port)] * len(TYPES)


def test_compose_runs_the_history_of_the_prefix() -> None:
    services = yaml.safe_load((DEPLOY / "compose.workers.yml").read_text())["services"]
    history = services.pop("history")
    assert history["command"] == HISTORY
    assert history["build"]["dockerfile"] == "ops/deploy/Dockerfile"
    # After setup: its `db migrate` made stream_jobs_history.
    assert history["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    assert {history["depends_on"][name]["condition"] for name in ("kafka", "postgres")} == {
        "service_healthy"}
    assert history["restart"] == "on-failure"  # a crash exits 1; SIGTERM exits 0
    assert history["deploy"]["replicas"] == 1
    env = history["environment"]
    # The prefix its workers use, the settings they reach the stack with.
    for worker in services.values():
        for name in ("STREAM_JOBS_TOPIC_PREFIX", "STREAM_JOBS_KAFKA_BOOTSTRAP",
                     "STREAM_JOBS_DATABASE_URL"):
            assert env[name] == worker["environment"][name], name
    # Writable by the image's unprivileged user, without a volume: scratch space.
    assert Path(env["STREAM_JOBS_HISTORY_DATA_DIR"]).is_relative_to("/tmp")
    assert "history_data_dir" in Settings.model_fields


def k8s_documents() -> dict[str, list[dict[str, Any]]]:
    return {path.name: [d for d in yaml.safe_load_all(path.read_text()) if d]
            for path in sorted((DEPLOY / "k8s").glob("*.yaml"))}


def test_kubernetes_deployment_and_scaled_object_per_type() -> None:
    docs = k8s_documents()
    docs.pop(Path(HISTORY_K8S).name)  # test_kubernetes_runs_one_history_process
    config = {d["kind"]: d for d in docs.pop("config.yaml")}
    prefix = config["ConfigMap"]["data"]["STREAM_JOBS_TOPIC_PREFIX"]
    assert set(docs) == {f"{t}.yaml" for t in TYPES}
    for filename, documents in docs.items():
        by_kind = {d["kind"]: d for d in documents}
        assert set(by_kind) == {"Deployment", "ScaledObject"}, filename
        deployment, scaled = by_kind["Deployment"], by_kind["ScaledObject"]
        job_type = deployment["metadata"]["labels"]["stream-jobs/job-type"]
        assert job_type in TYPES
        assert filename == f"{job_type}.yaml"
        policy = TYPES[job_type]
        pod = deployment["spec"]["template"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= \
            pod["metadata"]["labels"].items()
        (container,) = pod["spec"]["containers"]
        assert type_of(container["command"]) == job_type
        assert pod["spec"]["terminationGracePeriodSeconds"] >= 30  # the drain fits

        spec = scaled["spec"]
        assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert spec["minReplicaCount"] >= 1  # the relay runs in the worker
        assert spec["maxReplicaCount"] == policy.partitions
        triggers = spec["triggers"]
        assert {t["type"] for t in triggers} == {"kafka"}
        assert {t["metadata"]["consumerGroup"] for t in triggers} == {
            worker_group(prefix, job_type)}
        assert [t["metadata"]["topic"] for t in triggers] == list(
            policy.lane_topics(prefix).values())
        assert all(int(t["metadata"]["lagThreshold"]) > 0 for t in triggers)


def test_kubernetes_runs_one_history_process() -> None:
    docs = k8s_documents()
    (deployment,) = docs[Path(HISTORY_K8S).name]
    assert deployment["kind"] == "Deployment"
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"  # a rollout never runs two
    pod = spec["template"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["restartPolicy"] == "Always"  # a crash exits 1: started again
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["spec"]["containers"]
    assert container["command"] == HISTORY
    # The workers' settings (the ConfigMap and the Secret), and a data folder it can write.
    assert [ref.get("configMapRef", ref.get("secretRef"))["name"]
            for ref in container["envFrom"]] == ["stream-jobs", "stream-jobs"]
    env = {item["name"]: item["value"] for item in container["env"]}
    ((volume, mounted),) = [(m["name"], m["mountPath"]) for m in container["volumeMounts"]]
    assert env["STREAM_JOBS_HISTORY_DATA_DIR"] == mounted
    assert "emptyDir" in {v["name"]: v for v in pod["spec"]["volumes"]}[volume]
    # Nothing scales it: every ScaledObject targets a worker's Deployment.
    targets = {d["spec"]["scaleTargetRef"]["name"] for documents in docs.values()
               for d in documents if d["kind"] == "ScaledObject"}
    assert deployment["metadata"]["name"] not in targets


def unit_lines(path: Path) -> dict[str, list[str]]:
    """`key=value` lines of a systemd unit or env file (keys may repeat)."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_systemd_template_and_an_env_file_per_type() -> None:
    unit = unit_lines(DEPLOY / "systemd" / "stream-jobs-worker@.service")
    (exec_start,) = unit["ExecStart"]
    words = exec_start.split()
    assert words[0].endswith("/stream-jobs")
    assert words[1] == "worker"
    assert words[words.index("--type") + 1] == "%i"  # the instance name is the type
    assert "/etc/stream-jobs/%i.env" in unit["EnvironmentFile"]
    assert unit["KillSignal"] == ["SIGTERM"]
    envs = sorted((DEPLOY / "systemd").glob("*.env"))
    per_type = {p.name.removesuffix(".env") for p in envs} - {"stream-jobs"}
    assert per_type == set(TYPES)
    for job_type in per_type:
        env = unit_lines(DEPLOY / "systemd" / f"{job_type}.env")
        assert ":" in env["STREAM_JOBS_APP"][0]  # MODULE:APP


def test_systemd_unit_for_every_type_on_all_cores() -> None:
    from stream_jobs.runtime.supervisor import STOP_TIMEOUT_S

    unit = unit_lines(DEPLOY / "systemd" / "stream-jobs-workers.service")
    (exec_start,) = unit["ExecStart"]
    words = exec_start.split()
    assert words[1:] == ["worker", "consumers.demo:app", "--processes", "auto"]
    assert "--type" not in words  # every type the app has a handler for
    # Only the supervisor gets SIGTERM (it forwards it); systemd waits longer than it does.
    assert unit["KillSignal"] == ["SIGTERM"]
    assert unit["KillMode"] == ["mixed"]
    assert int(unit["TimeoutStopSec"][0]) > STOP_TIMEOUT_S
    assert unit["EnvironmentFile"] == ["/etc/stream-jobs/stream-jobs.env"]


def test_systemd_unit_for_the_history_process() -> None:
    unit = unit_lines(DEPLOY / HISTORY_SYSTEMD)
    (exec_start,) = unit["ExecStart"]
    words = exec_start.split()
    assert words[0].endswith("/stream-jobs")
    assert words[1:] == ["history"]
    assert unit["EnvironmentFile"] == ["/etc/stream-jobs/stream-jobs.env"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["KillSignal"] == ["SIGTERM"]
    # ProtectSystem=strict leaves the state directory the one place it can write.
    assert unit["ProtectSystem"] == ["strict"]
    (state,) = unit["StateDirectory"]
    assert unit["Environment"] == [f"STREAM_JOBS_HISTORY_DATA_DIR=/var/lib/{state}"]
