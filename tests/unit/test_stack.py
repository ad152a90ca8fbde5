"""The local stack's pure parts: where the jars are cached, how a broker is started, and the
test session's choice of stack. No services: Maven and Java are stand-in scripts here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stream_jobs.errors import PrerequisiteMissing, StackError
from stream_jobs.settings import Settings
from stream_jobs.stack.kafka import (
    KafkaCluster,
    jars_home,
    kafka_version,
    release_features,
    release_of,
    resolve_jars,
)

REPO = Path(__file__).resolve().parents[2]

# Stands in for `mvn dependency:copy-dependencies`: notes each run, fills the output folder.
FAKE_MVN = f"""#!{sys.executable}
import os, sys
with open(os.environ["FAKE_MVN_RUNS"], "a") as runs:
    runs.write("run\\n")
for arg in sys.argv[1:]:
    if arg.startswith("-DoutputDirectory="):
        lib = arg.split("=", 1)[1]
        os.makedirs(lib, exist_ok=True)
        open(os.path.join(lib, "kafka.jar"), "w").close()
sys.exit(int(os.environ.get("FAKE_MVN_EXIT", "0")))
"""


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH of nothing but a stand-in `java` and `mvn`; returns the file that counts runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("mvn", FAKE_MVN), ("java", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    runs = tmp_path / "mvn-runs"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_MVN_RUNS", str(runs))
    return runs


def runs_of(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_the_default_jars_cache_is_outside_the_repository() -> None:
    default = Path(Settings.model_fields["jars_cache_dir"].default).expanduser().resolve()
    assert not default.is_relative_to(REPO)


def test_resolved_jars_are_reused_without_maven_or_java(
    tmp_path: Path, fake_tools: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(jars_cache_dir=tmp_path / "cache")
    lib = resolve_jars(settings)
    assert runs_of(fake_tools) == 1
    assert lib.is_relative_to(tmp_path / "cache")
    assert kafka_version(REPO / "ops" / "kafka" / "pom.xml") in str(lib)
    assert (lib / "kafka.jar").is_file()

    # Without java and mvn a fresh resolve would stop; a resolved cache is returned at once.
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(PrerequisiteMissing, match="Java"):
        resolve_jars(Settings(jars_cache_dir=tmp_path / "empty-cache"))
    assert resolve_jars(settings) == lib
    assert runs_of(fake_tools) == 1


def test_a_failed_maven_run_says_so_and_is_retried_next_time(
    tmp_path: Path, fake_tools: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(jars_cache_dir=tmp_path / "cache")
    monkeypatch.setenv("FAKE_MVN_EXIT", "1")
    with pytest.raises(PrerequisiteMissing, match="registry") as failed:
        resolve_jars(settings)
    assert "maven.log" in str(failed.value)
    monkeypatch.delenv("FAKE_MVN_EXIT")
    assert resolve_jars(settings).is_dir()
    assert runs_of(fake_tools) == 2


def test_a_cache_of_the_old_version_alone_resolves_the_pinned_one(
    tmp_path: Path, fake_tools: Path,
) -> None:
    """A machine that ran the stack before the pin moved: its cache holds the 4.1.1 jars
    only. `dev up` resolves the pinned version beside them and never returns the old."""
    pom = REPO / "ops" / "kafka" / "pom.xml"
    pinned = kafka_version(pom)
    assert pinned != "4.1.1"
    cache = tmp_path / "cache"
    old_pom = tmp_path / "old-pom.xml"
    old_pom.write_text(pom.read_text().replace(f">{pinned}<", ">4.1.1<"))
    old_home = jars_home(Settings(jars_cache_dir=cache), old_pom)
    (old_home / "lib").mkdir(parents=True)
    (old_home / "lib" / "kafka-server-4.1.1.jar").touch()
    (old_home / ".resolved").write_text("ok\n")
    assert old_home.name.startswith("kafka-4.1.1-")

    lib = resolve_jars(Settings(jars_cache_dir=cache))
    assert runs_of(fake_tools) == 1
    assert lib.parent.name.startswith(f"kafka-{pinned}-")
    assert lib.parent == jars_home(Settings(jars_cache_dir=cache), pom)
    assert not lib.is_relative_to(old_home)
    # The old jars are left as they were (a checkout of an older commit still uses them).
    assert (old_home / "lib" / "kafka-server-4.1.1.jar").is_file()


def test_the_pom_and_any_change_to_it_key_the_cache(tmp_path: Path) -> None:
    settings = Settings(jars_cache_dir=tmp_path)
    pom = tmp_path / "pom.xml"
    pom.write_text("<kafka.version>4.4.0</kafka.version>")
    first = jars_home(settings, pom)
    pom.write_text("<kafka.version>4.4.0</kafka.version><!-- another log4j -->")
    assert jars_home(settings, pom) != first
    assert jars_home(settings, pom).name.startswith("kafka-4.4.0-")


def test_the_feature_release_of_a_version() -> None:
    assert release_of("4.4.0") == "4.4"
    assert release_of("4.10") == "4.10"
    with pytest.raises(StackError, match="not a Kafka version"):
        release_of("4.4.0-SNAPSHOT")


# What `kafka-features version-mapping --release-version 4.4` prints with the 4.4.0 jars.
VERSION_MAPPING_4_4 = """metadata.version=33 (4.4)
kraft.version=1
transaction.version=2
group.version=1
eligible.leader.replicas.version=1
share.version=2
streams.version=1
"""


def test_a_version_move_upgrades_the_features_a_fresh_format_would_set() -> None:
    # kraft.version stays: a quorum of static voters formats at 0 and stays there.
    assert release_features(VERSION_MAPPING_4_4) == [
        "metadata.version=33", "transaction.version=2", "group.version=1",
        "eligible.leader.replicas.version=1", "share.version=2", "streams.version=1"]
    with pytest.raises(StackError, match=r"no metadata\.version"):
        release_features("Unknown release version 9.9\n")


def heap_flags(argv: list[str]) -> list[str]:
    return [arg for arg in argv if arg.startswith("-Xmx")]


def test_a_single_broker_runs_with_a_capped_heap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STREAM_JOBS_DEV_KAFKA_HEAP_MB", raising=False)
    cluster = KafkaCluster(Settings(stack_dir=tmp_path), 1)
    argv = cluster.server_argv(cluster.nodes[0], tmp_path / "lib")
    assert heap_flags(argv) == ["-Xmx1024m"]
    # JVM options count only before the main class.
    assert argv.index("-Xmx1024m") < argv.index("kafka.Kafka")
    assert argv[-1] == str(cluster.nodes[0].config)

    smaller = KafkaCluster(Settings(stack_dir=tmp_path, dev_kafka_heap_mb=300), 1)
    assert heap_flags(smaller.server_argv(smaller.nodes[0], tmp_path / "lib")) == ["-Xmx300m"]


def test_each_cluster_node_gets_three_quarters_of_the_heap(tmp_path: Path) -> None:
    cluster = KafkaCluster(Settings(stack_dir=tmp_path, dev_kafka_heap_mb=512), 3)
    for node in cluster.nodes:
        assert heap_flags(cluster.server_argv(node, tmp_path / "lib")) == ["-Xmx384m"]


@pytest.mark.parametrize(("brokers", "replication", "min_isr"), [(1, 1, 1), (3, 3, 2)])
def test_broker_config_sets_replication_and_min_isr(
    tmp_path: Path, brokers: int, replication: int, min_isr: int,
) -> None:
    cluster = KafkaCluster(Settings(stack_dir=tmp_path), brokers)
    for node in cluster.nodes:
        lines = set(cluster._render_config(node).splitlines())
        assert f"default.replication.factor={replication}" in lines
        assert f"min.insync.replicas={min_isr}" in lines
        assert f"transaction.state.log.min.isr={min_isr}" in lines


def pytest_run(**env: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of one quick unit test, under `env` for the two stack settings."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("STREAM_JOBS_KAFKA_BOOTSTRAP", "STREAM_JOBS_DATABASE_URL")}
    # Without the plugins (hypothesis alone takes seconds to import); the conftest is all
    # this session needs.
    env = {**base, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-W", "ignore::pytest.PytestConfigWarning",
         "tests/unit/test_stack.py::test_the_default_jars_cache_is_outside_the_repository"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.mark.parametrize(("given", "missing"), [
    ("STREAM_JOBS_KAFKA_BOOTSTRAP", "STREAM_JOBS_DATABASE_URL"),
    ("STREAM_JOBS_DATABASE_URL", "STREAM_JOBS_KAFKA_BOOTSTRAP"),
])
def test_half_an_external_stack_stops_the_session(given: str, missing: str) -> None:
    value = {"STREAM_JOBS_KAFKA_BOOTSTRAP": "127.0.0.1:1",
             "STREAM_JOBS_DATABASE_URL": "postgresql://u@127.0.0.1:1/d"}[given]
    result = pytest_run(**{given: value})
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"ERROR: {given} is set but {missing} is not: set both to test against "
                     "your own services, or neither to test against the local stack "
                     "(stream-jobs dev up)."]
    assert "passed" not in result.stdout


def test_both_external_settings_run_the_session() -> None:
    # Neither set is every ordinary run of this suite.
    result = pytest_run(STREAM_JOBS_KAFKA_BOOTSTRAP="127.0.0.1:1",
                        STREAM_JOBS_DATABASE_URL="postgresql://u@127.0.0.1:1/d")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert "warning" not in result.stdout
