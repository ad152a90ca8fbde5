"""The local stack itself: cluster formation, idempotent up/down, crash recovery, clear errors.

Every test that starts, stops or kills something does it to a stack of its own, in a
folder of its own on ports of its own, so the shared stack that the other integration
tests use (127.0.0.1:9092, Postgres 54320) is never disturbed; `dev check` only reads it.
The three-node cluster runs on `dev_cluster_ports` (19092/19192/19292 by default, each +1
and +2), so the single-node ports are drawn from a range that cannot meet them.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from stream_jobs.errors import BrokerUnavailable, DatabaseUnavailable
from stream_jobs.history.store import HistoryStore
from stream_jobs.runtime.reports import WorkerReport, ensure_stats_topic
from stream_jobs.settings import Settings
from stream_jobs.stack import HistoryProcess, KafkaCluster, PostgresServer
from stream_jobs.stack.process import cmdline, pid_alive
from stream_jobs.tools.probe import probe_kafka, probe_postgres

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "stream-jobs"
# Below Linux's ephemeral range (32768+) and clear of the cluster's 19092-19294.
PORT_RANGE = (20_000, 28_999)


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A port such that it and the `span - 1` after it are free (Kafka's controller is +1)."""
    for _ in range(200):
        port = random.randint(*PORT_RANGE)
        if all(bindable(port + i) for i in range(span)):
            return port
    raise RuntimeError("no free port pair found in the test range")


async def apoll(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Await `condition()` until it returns truthy; KafkaError counts as not yet."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            result = condition()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
        except KafkaError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s (last: {last!r})")
        await asyncio.sleep(0.2)  # polling a condition with a deadline


async def config_values(admin: AIOKafkaAdminClient, resources: list[ConfigResource],
                        key: str) -> list[str]:
    """The value of config `key` for each resource, in the order Kafka answers."""
    values = []
    for response in await admin.describe_configs(resources):
        for resource in response.to_object()["resources"]:
            assert resource["error_code"] == 0, resource
            values += [str(entry["config_value"]) for entry in resource["config_entries"]
                       if entry["config_names"] == key]
    return values


async def create_topic(admin: AIOKafkaAdminClient, topic: str, partitions: int,
                       replication: int) -> bool:
    """Whether the topic now exists; the admin client reports refusals without raising."""
    response = await admin.create_topics([NewTopic(topic, partitions, replication)])
    [outcome] = response.to_object()["topic_errors"]
    # 36 (already exists): an earlier attempt of the same poll got through.
    return outcome["error_code"] in (0, 36)


def processes_mentioning(text: str) -> list[int]:
    """Live pids whose command line contains `text` (zombies have an empty one)."""
    needle = text.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_JOBS_")}
    env.update(
        STREAM_JOBS_STACK_DIR=str(settings.stack_dir),
        STREAM_JOBS_DEV_KAFKA_PORT=str(settings.dev_kafka_port),
        STREAM_JOBS_DEV_POSTGRES_PORT=str(settings.dev_postgres_port),
        STREAM_JOBS_JARS_CACHE_DIR=str(settings.jars_cache_dir),
        STREAM_JOBS_DEV_CLUSTER_PORTS=json.dumps(list(settings.dev_cluster_ports)),
        **extra,
    )
    return env


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=180, check=False)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The CLI failed with exactly one `error:` sentence, no traceback; returns that line."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    assert line.count("error:") == 1, line
    assert line.rstrip().endswith("."), line
    for fragment in fragments:
        assert fragment in line, line
    return line


def stop_everything(settings: Settings) -> None:
    for history in HistoryProcess.known(settings):
        history.down()
    KafkaCluster(settings, 1).down()
    KafkaCluster(settings, 3).down()
    PostgresServer(settings).down()


@pytest.fixture(scope="module")
def stack_root() -> Iterator[Path]:
    """A folder for this module's stacks that the `postgres` OS user can traverse.

    pytest's tmp_path lives under a root-only folder, where Postgres could not keep its
    data beside Kafka's; this keeps every byte of a test stack in one removable place.
    """
    root = Path(tempfile.mkdtemp(prefix="stream-jobs-stack-test-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def isolated(stack_root: Path) -> Iterator[Callable[[], Settings]]:
    """Makes settings for a fresh stack; whatever it started is stopped afterwards."""
    made: list[Settings] = []

    def make() -> Settings:
        settings = Settings(stack_dir=stack_root / uuid.uuid4().hex[:8],
                            dev_kafka_port=free_port(span=2), dev_postgres_port=free_port())
        made.append(settings)
        return settings

    yield make
    for settings in made:
        stop_everything(settings)


@pytest.fixture(scope="module")
def solo_settings(stack_root: Path) -> Iterator[Settings]:
    settings = Settings(stack_dir=stack_root / "solo", dev_kafka_port=free_port(span=2),
                        dev_postgres_port=free_port())
    yield settings
    stop_everything(settings)


@pytest.fixture
def solo(solo_settings: Settings) -> Settings:
    """A running single-node broker of our own, started once and shared; `up` is a no-op
    while it runs, so a test that kills it does not take the next test down with it."""
    KafkaCluster(solo_settings, 1).up()
    return solo_settings


async def test_three_brokers_form_one_cluster_and_replicate_a_topic(stack_root: Path) -> None:
    settings = Settings(stack_dir=stack_root / "cluster")
    env = cli_env(settings)
    cluster = KafkaCluster(settings, 3)
    topic = f"replicated-{uuid.uuid4().hex[:8]}"
    try:
        # --no-postgres: the brokers are the subject; test_up_twice_is_a_no_op_and_down_
        # leaves_nothing_running starts Postgres, and here it would only add seconds.
        up = await asyncio.to_thread(run_cli, "dev", "up", "--brokers", "3", "--no-postgres",
                                     env=env)
        assert up.returncode == 0, up.stderr
        pids = [row.pid for row in cluster.status()]
        assert None not in pids
        assert len(set(pids)) == 3
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        await admin.start()
        try:
            async def three_brokers() -> bool:
                return len((await admin.describe_cluster())["brokers"]) == 3

            await apoll(three_brokers, 60, "three brokers in the metadata")
            brokers = [ConfigResource(ConfigResourceType.BROKER, str(node.node_id))
                       for node in cluster.nodes]
            assert await config_values(admin, brokers, "min.insync.replicas") == ["2"] * 3
            # Until every broker is unfenced, the controller refuses replication factor 3.
            await apoll(lambda: create_topic(admin, topic, 3, 3), 60,
                        "creating a topic with replication factor 3")

            async def fully_replicated() -> bool:
                [described] = await admin.describe_topics([topic])
                partitions = described["partitions"]
                return len(partitions) == 3 and all(
                    len(p["replicas"]) == 3 and len(p["isr"]) == 3 for p in partitions)

            await apoll(fully_replicated, 60, "three in-sync replicas per partition")
            # The topic sets nothing itself: it inherits the cluster's minimum.
            resource = ConfigResource(ConfigResourceType.TOPIC, topic)

            async def every_broker_knows_it() -> bool:
                # A describe goes to any broker, and one whose metadata is a moment behind
                # answers UNKNOWN_TOPIC_OR_PARTITION (seen in a loaded CI run).
                for response in await admin.describe_configs([resource]):
                    if any(r["error_code"] for r in response.to_object()["resources"]):
                        return False
                return True

            await apoll(every_broker_knows_it, 60, "the topic's configs answered")
            assert await config_values(admin, [resource], "min.insync.replicas") == ["2"]
        finally:
            await admin.close()

        # acks=all needs min.insync.replicas=2 of 3: a write proves replication is live.
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all",
                                    enable_idempotence=True)
        await producer.start()
        try:
            written = await producer.send_and_wait(topic, b"replicated", key=b"k")
        finally:
            await producer.stop()
        assert written.offset == 0
    finally:
        down = await asyncio.to_thread(run_cli, "dev", "down", env=env)
    assert down.returncode == 0, down.stderr
    for node, pid in zip(cluster.nodes, pids, strict=True):
        assert f"kafka-cluster node {node.node_id} (pid {pid})" in down.stdout
        assert not pid_alive(pid)
    assert processes_mentioning(str(cluster.home)) == []


def test_up_twice_is_a_no_op_and_down_leaves_nothing_running(
    isolated: Callable[[], Settings],
) -> None:
    settings = isolated()
    env = cli_env(settings)
    kafka, postgres = KafkaCluster(settings, 1), PostgresServer(settings)
    history = HistoryProcess(settings)

    first = run_cli("dev", "up", env=env)
    assert first.returncode == 0, first.stderr
    kafka_pid, postgres_pid = kafka.status()[0].pid, postgres.running_pid()
    history_pid = history.pid()
    assert kafka_pid is not None
    assert postgres_pid is not None
    assert history_pid is not None
    assert status_rows(first.stdout)["history jobs"][:3] == \
        ["history jobs", "running", str(history_pid)]

    second = run_cli("dev", "up", env=env)
    assert second.returncode == 0, second.stderr
    assert (kafka.status()[0].pid, postgres.running_pid(), history.pid()) == \
        (kafka_pid, postgres_pid, history_pid)

    down = run_cli("dev", "down", env=env)
    assert down.returncode == 0, down.stderr
    assert f"pid {kafka_pid}" in down.stdout
    assert f"pid {postgres_pid}" in down.stdout
    # The history first, while the broker it commits to still answers.
    assert down.stdout.index(f"history jobs (pid {history_pid})") < \
        down.stdout.index(f"pid {kafka_pid}")
    assert not pid_alive(kafka_pid)
    assert not pid_alive(postgres_pid)
    assert not pid_alive(history_pid)
    assert "history stopped" in history.log_file.read_text()  # SIGTERM: a clean stop
    assert processes_mentioning(str(settings.stack_dir.resolve())) == []
    assert processes_mentioning(str(postgres.data)) == []
    assert not kafka.status()[0].running
    assert not postgres.status().running


async def report_and_see_counted(settings: Settings, slot_ms: int, succeeded: int,
                                 counted: int) -> None:
    """Publish one worker's report (`succeeded` jobs in its slot `slot_ms`, cumulative) to
    the prefix's reports topic; the history's running total must come to `counted`."""
    at_ms = int(time.time() * 1000)
    report = WorkerReport(job_type="dev.history", worker_id="dev-stack-test", at_ms=at_ms,
                          started_at_ms=at_ms, outcomes={"succeeded": succeeded},
                          slot_ms=settings.history_window_s * 1000,
                          slots={slot_ms: {"outcomes": {"succeeded": succeeded}}})
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(f"{settings.topic_prefix}._stats", report.to_json(),
                                     key=report.worker_id.encode())
    finally:
        await producer.stop()
    store = HistoryStore(settings)

    async def counted_so() -> bool:
        tally = (await store.totals()).get("dev.history")
        return tally is not None and tally.outcomes == {"succeeded": counted}

    try:
        # Joining its group takes seconds; after a kill -9, the dead member's session too.
        await apoll(counted_so, 120, f"the history's total of {counted} in Postgres")
    finally:
        await store.close()


async def test_dev_up_runs_the_history_of_the_prefix_and_the_next_up_revives_it(
    isolated: Callable[[], Settings],
) -> None:
    settings = isolated()
    env = cli_env(settings)
    kafka, postgres = KafkaCluster(settings, 1), PostgresServer(settings)
    history = HistoryProcess(settings)
    up = await asyncio.to_thread(run_cli, "dev", "up", env=env)
    assert up.returncode == 0, up.stderr
    first = history.pid()
    assert first is not None
    assert f"--topic-prefix {settings.topic_prefix} history" in cmdline(first)
    stack = settings.model_copy(update={"kafka_bootstrap": kafka.bootstrap,
                                        "database_url": postgres.dsn})
    # The schema dev up migrated, the broker dev up runs: a report folds into Postgres.
    await ensure_stats_topic(stack)
    size_ms = stack.history_window_s * 1000
    slot_ms = int(time.time() * 1000) // size_ms * size_ms
    await report_and_see_counted(stack, slot_ms, succeeded=3, counted=3)

    os.kill(first, signal.SIGKILL)
    await apoll(lambda: not pid_alive(first), 30, "the killed history to disappear")
    status = await asyncio.to_thread(run_cli, "dev", "status", env=env)
    rows = status_rows(status.stdout)
    assert rows["history jobs"][1] == "stopped"
    assert rows["kafka"][1] == rows["postgres"][1] == "running"
    logs = dict(line.split(": ", 1) for line in status_lines(status.stdout, "log"))
    assert logs["history jobs"] == str(history.log_file)
    assert "history of prefix jobs" in history.log_file.read_text()

    without = await asyncio.to_thread(run_cli, "dev", "up", "--no-history", env=env)
    assert without.returncode == 0, without.stderr
    assert history.pid() is None
    again = await asyncio.to_thread(run_cli, "dev", "up", env=env)
    assert again.returncode == 0, again.stderr
    second = history.pid()
    assert second not in (None, first)
    assert status_rows(again.stdout)["history jobs"][:3] == \
        ["history jobs", "running", str(second)]
    # The same worker's next report (5 in the same slot, cumulative) adds 2, not 5: the
    # history restarted from its changelogs, not from nothing.
    await report_and_see_counted(stack, slot_ms, succeeded=5, counted=5)


async def test_broker_killed_with_sigkill_comes_back_with_its_data(solo: Settings) -> None:
    cluster = KafkaCluster(solo, 1)
    bootstrap = cluster.bootstrap
    topic = f"survivor-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        assert await create_topic(admin, topic, 1, 1)
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(topic, f"before-{i}".encode())
    finally:
        await producer.stop()

    pid_file = cluster.nodes[0].pid_file
    killed = cluster.kill_node(1)
    await apoll(lambda: not pid_alive(killed), 30, "the killed broker to disappear")
    assert pid_file.read_text().split() == [str(killed)], "the crash left no stale pid file"
    # --no-postgres: this module's shared broker has no Postgres, and a test below needs
    # its data folder absent.
    up = await asyncio.to_thread(run_cli, "dev", "up", "--no-postgres", env=cli_env(solo))
    assert up.returncode == 0, up.stderr
    restarted = int(pid_file.read_text().split()[0])
    assert restarted != killed
    assert pid_alive(restarted)
    assert str(cluster.nodes[0].config) in cmdline(restarted)
    assert re.search(rf"\brunning\b.*\b{restarted}\b", up.stdout), up.stdout

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        # Log recovery after an unclean stop can keep the partition leaderless for a moment.
        await apoll(lambda: producer.send_and_wait(topic, b"after"), 60, "a write after restart")
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    seen: list[bytes] = []
    try:
        async def all_four() -> bool:
            batches = await consumer.getmany(timeout_ms=1_000)
            seen.extend(r.value for records in batches.values() for r in records if r.value)
            return len(seen) >= 4

        await apoll(all_four, 60, "reading back the records from before and after the kill")
    finally:
        await consumer.stop()
    assert seen == [b"before-0", b"before-1", b"before-2", b"after"]


def test_kafka_port_in_use_is_one_clear_sentence(isolated: Callable[[], Settings]) -> None:
    settings = isolated()
    port = settings.dev_kafka_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = run_cli("dev", "up", "--no-postgres", env=cli_env(settings))
    assert_one_line_error(result, f"127.0.0.1:{port}", "already in use",
                          "STREAM_JOBS_DEV_KAFKA_PORT")
    assert processes_mentioning(str(settings.stack_dir.resolve())) == []


@pytest.mark.parametrize(("on_path", "fragments"), [
    ((), ("Java 17+ is not installed", "make setup")),
    (("java",), ("Maven is not installed", "make setup")),
])
def test_missing_java_or_maven_is_one_clear_sentence(
    isolated: Callable[[], Settings], tmp_path: Path, on_path: tuple[str, ...],
    fragments: tuple[str, ...],
) -> None:
    jars = tmp_path / "jars"
    settings = isolated().model_copy(update={"jars_cache_dir": jars})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in on_path:
        found = shutil.which(tool)
        assert found, f"this test needs {tool} installed"
        (bin_dir / tool).symlink_to(found)
    result = run_cli("dev", "up", env=cli_env(settings, PATH=str(bin_dir)))
    assert_one_line_error(result, *fragments)
    assert not jars.exists() or not any(jars.iterdir())
    assert processes_mentioning(str(settings.stack_dir.resolve())) == []


MAVEN_SETTINGS = """<settings>
  <mirrors>
    <mirror>
      <id>closed</id>
      <mirrorOf>*</mirrorOf>
      <url>http://127.0.0.1:{port}/maven2</url>
    </mirror>
  </mirrors>
</settings>
"""


def test_maven_that_cannot_reach_its_registry_is_one_clear_sentence(
    isolated: Callable[[], Settings], tmp_path: Path,
) -> None:
    jars = tmp_path / "jars"
    settings = isolated().model_copy(update={"jars_cache_dir": jars})
    closed = free_port()
    # Maven finds ~/.m2 by the JVM's user.home, not $HOME: pointed at a folder of ours it
    # has an empty local repository and one mirror on a closed port, and no global config
    # is touched.
    home = tmp_path / "maven-home"
    (home / ".m2").mkdir(parents=True)
    (home / ".m2" / "settings.xml").write_text(MAVEN_SETTINGS.format(port=closed))
    # The quick compiler and the small collector: Maven's JVM starts in a third of the time.
    opts = f"-Duser.home={home} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    result = run_cli("dev", "up", env=cli_env(settings, MAVEN_OPTS=opts))
    line = assert_one_line_error(result, "Maven could not resolve the Kafka jars",
                                 "reaches its package registry")
    found = re.search(r"\(see (\S+/maven\.log)\)", line)
    assert found, line
    log = Path(found.group(1))
    assert log.is_relative_to(jars)
    assert f"127.0.0.1:{closed}" in log.read_text(), "Maven did not try the closed mirror"
    assert list(jars.rglob(".resolved")) == []
    assert processes_mentioning(str(settings.stack_dir.resolve())) == []


def test_root_owned_postgres_data_is_one_clear_sentence(solo: Settings) -> None:
    # `dev up` starts Kafka before Postgres; the module's broker is already up, so this
    # reaches the Postgres check without another JVM start.
    server = PostgresServer(solo)
    server.data.mkdir(parents=True)
    (server.data / "PG_VERSION").write_text("15\n")
    assert server.data.stat().st_uid == 0, "this test needs to run as root"
    try:
        result = run_cli("dev", "up", env=cli_env(solo))
        assert_one_line_error(result, str(server.data), "owned by root", "chown")
        assert server.running_pid() is None
        assert processes_mentioning(str(server.data)) == []
    finally:
        shutil.rmtree(server.data)


def check_env(kafka_bootstrap: str, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_JOBS_")}
    env.update(STREAM_JOBS_KAFKA_BOOTSTRAP=kafka_bootstrap, STREAM_JOBS_DATABASE_URL=database_url)
    return env


# `dev check` only connects and asks, so these three read the shared stack (the conftest's
# `settings`) for whichever service is meant to answer.


def status_rows(output: str) -> dict[str, list[str]]:
    """The cells of each row of rich's status table."""
    rows = {}
    for line in output.splitlines():
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
            rows[cells[0]] = cells
    return rows


def status_lines(output: str, label: str) -> list[str]:
    """The plain `label: ...` lines under the table, without their label."""
    return [line[len(label) + 2:] for line in output.splitlines()
            if line.startswith(f"{label}: ")]


def test_dev_status_names_the_servers_the_dsn_and_each_log(settings: Settings) -> None:
    if os.environ.get("STREAM_JOBS_KAFKA_BOOTSTRAP"):
        pytest.skip("the session uses services named by STREAM_JOBS_*, not `dev up`'s")
    # A password in the configured URL must not reach the output.
    url = settings.database_url.replace("stream_jobs@", "stream_jobs:hunter2@", 1)
    assert "hunter2" in url
    # A narrow terminal: the settings and paths are plain lines, never folded.
    result = run_cli("dev", "status",
                     env=cli_env(settings, STREAM_JOBS_DATABASE_URL=url, COLUMNS="60"))
    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout
    rows = status_rows(result.stdout)
    home = settings.stack_dir.resolve()
    kafka_pid = (home / "kafka" / "kafka.pid").read_text().strip()
    assert rows["kafka"][:3] == ["kafka", "running", kafka_pid]
    assert rows["postgres"][:2] == ["postgres", "running"]
    connect = status_lines(result.stdout, "connect")
    assert f"STREAM_JOBS_KAFKA_BOOTSTRAP={settings.kafka_bootstrap}" in connect
    assert f"STREAM_JOBS_DATABASE_URL={settings.database_url}" in connect
    logs = dict(line.split(": ", 1) for line in status_lines(result.stdout, "log"))
    assert logs["kafka"] == str(home / "kafka" / "kafka.log")
    for node in (1, 2, 3):
        assert logs[f"kafka-cluster node {node}"] == \
            str(home / "kafka-cluster" / f"node{node}" / "kafka.log")
    # The running services' logs are real files the services write.
    for log in (logs["kafka"], logs["postgres"]):
        assert Path(log).is_file(), log
        assert Path(log).stat().st_size > 0, log


def test_dev_check_names_the_silent_kafka_setting(settings: Settings) -> None:
    wrong = f"127.0.0.1:{free_port()}"
    result = run_cli("dev", "check", env=check_env(wrong, settings.database_url))
    assert_one_line_error(result, f"at {wrong} ", "STREAM_JOBS_KAFKA_BOOTSTRAP",
                          "stream-jobs dev up")
    assert "no answer" in result.stdout
    assert "PostgreSQL" in result.stdout, "the table should still show Postgres answering"


def test_dev_check_names_the_silent_postgres_setting(settings: Settings) -> None:
    wrong = f"postgresql://stream_jobs:hunter2@127.0.0.1:{free_port()}/stream_jobs"
    result = run_cli("dev", "check", env=check_env(settings.kafka_bootstrap, wrong))
    line = assert_one_line_error(result, "STREAM_JOBS_DATABASE_URL", "stream-jobs dev up",
                                 wrong.replace("hunter2", "***"))
    assert "hunter2" not in line + result.stdout
    assert "broker" in result.stdout, "the table should still show Kafka answering"


def test_dev_check_passes_when_both_answer(settings: Settings) -> None:
    result = run_cli("dev", "check", env=check_env(settings.kafka_bootstrap,
                                                   settings.database_url))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("answers") == 2
    assert "broker" in result.stdout
    assert "PostgreSQL" in result.stdout


async def test_probes_wrap_driver_errors() -> None:
    silent = Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}",
                      database_url=f"postgresql://stream_jobs@127.0.0.1:{free_port()}/x")
    with pytest.raises(BrokerUnavailable) as kafka_error:
        await probe_kafka(silent, timeout_s=5)
    with pytest.raises(DatabaseUnavailable) as postgres_error:
        await probe_postgres(silent, timeout_s=5)
    assert kafka_error.value.__cause__ is not None
    assert postgres_error.value.__cause__ is not None

