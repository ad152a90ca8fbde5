"""A real Apache Kafka broker (KRaft combined mode) run from jars that Maven resolves.

The broker version is pinned in `ops/kafka/pom.xml`. Jars are copied once into a cache
outside the repository (`STREAM_JOBS_JARS_CACHE_DIR`), so later starts take seconds.
One node listens on 127.0.0.1:9092; `--brokers 3` starts a separate three-node cluster
on 127.0.0.1:19092, 19192 and 19292 by default (`dev_cluster_ports`; replication factor 3,
min.insync.replicas 2).
With `security=ScramTls(...)` the client listener demands TLS and SCRAM logins
(`stream_jobs.stack.secure`); that broker lives in a folder of its own.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from stream_jobs.errors import PrerequisiteMissing, StackError
from stream_jobs.settings import Settings
from stream_jobs.stack.process import (
    ServiceStatus,
    cmdline,
    ensure_port_free,
    port_open,
    read_pid,
    spawn,
    stop_pid,
    wait_until,
)
from stream_jobs.stack.secure import ScramTls, TlsFiles, listener_config, make_tls_files

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0
# A plain node's FRONT listener is on its port + FRONT_OFFSET and advertises port +
# FRONT_PROXY_OFFSET, where a fault proxy listens when a test puts one there (9095 and
# 29095 for the single broker; 19095/39095, 19195/39195, 19295/39295 for the cluster).
FRONT_OFFSET = 3
FRONT_PROXY_OFFSET = 20_003


def ops_dir() -> Path:
    """The project's `ops/` folder: found from the working directory up, else beside the package."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents, Path(__file__).resolve().parents[2]):
        if (folder / "ops" / "kafka" / "pom.xml").is_file():
            return folder / "ops"
    raise PrerequisiteMissing(
        "ops/kafka/pom.xml was not found: run stream-jobs dev from the project's checkout."
    )


def kafka_version(pom: Path) -> str:
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom.read_text())
    if match is None:
        raise StackError(f"{pom} does not pin <kafka.version>.")
    return match.group(1)


def jars_home(settings: Settings, pom: Path) -> Path:
    """The cache folder of the jars `pom` pins: keyed by the version and the pom's digest,
    so a moved pin (or any change to the pom) resolves afresh beside the old jars."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    return settings.jars_cache_dir.expanduser() / f"kafka-{kafka_version(pom)}-{digest}"


def release_of(version: str) -> str:
    """The feature release of a Kafka version: `4.4` of `4.4.0`."""
    match = re.fullmatch(r"(\d+\.\d+)(\.\d+)?", version)
    if match is None:
        raise StackError(f"{version!r} is not a Kafka version (like 4.4.0).")
    return match.group(1)


def release_features(mapping: str) -> list[str]:
    """`name=level` for each feature `kafka-features version-mapping` lists, as a fresh
    format by those jars finalizes them: all but kraft.version, which stays at 0 on a
    quorum of static voters (`controller.quorum.voters`)."""
    levels = re.findall(r"^([a-z][a-z.]*)=(\d+)", mapping, re.MULTILINE)
    if not any(name == "metadata.version" for name, _ in levels):
        raise StackError(f"kafka-features version-mapping named no metadata.version: {mapping!r}")
    return [f"{name}={level}" for name, level in levels if name != "kraft.version"]


def resolve_jars(settings: Settings) -> Path:
    """The folder of broker jars, resolving them with Maven on first use."""
    pom = ops_dir() / "kafka" / "pom.xml"
    home = jars_home(settings, pom)
    lib = home / "lib"
    done = home / ".resolved"
    if done.is_file():
        return lib
    if shutil.which("java") is None:
        raise PrerequisiteMissing("Java 17+ is not installed: run `make setup` (installs OpenJDK).")
    if shutil.which("mvn") is None:
        raise PrerequisiteMissing("Maven is not installed: run `make setup` (it installs maven).")
    home.mkdir(parents=True, exist_ok=True)
    log = home / "maven.log"
    with log.open("wb") as out:
        result = subprocess.run(
            ["mvn", "-B", "-f", str(pom), "dependency:copy-dependencies",
             f"-DoutputDirectory={lib}", "-DincludeScope=runtime"],
            stdout=out, stderr=subprocess.STDOUT, check=False,
        )
    if result.returncode != 0:
        raise PrerequisiteMissing(
            f"Maven could not resolve the Kafka jars (see {log}): check that Maven reaches "
            "its package registry (proxy settings in ~/.m2/settings.xml)."
        )
    done.write_text("ok\n")
    return lib


def random_cluster_id() -> str:
    """A KRaft cluster ID as `StorageTool random-uuid` makes one, without starting a JVM:
    16 random bytes in URL-safe base64, unpadded, never starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    home: Path
    # The PLAINTEXT inter-broker listener of a secure node (its clients' one is `port`).
    internal_port: int | None = None

    @property
    def config(self) -> Path:
        return self.home / "server.properties"

    @property
    def log_dir(self) -> Path:
        return self.home / "data"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "kafka.log"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def front_port(self) -> int:
        """The broker's FRONT listener: what a fault proxy in front of it forwards to."""
        return self.port + FRONT_OFFSET

    @property
    def front_proxy_port(self) -> int:
        """Where the FRONT listener says the broker is: the fault proxy's port for it.
        A client that bootstraps there is told the proxy's ports for every broker, so
        all its traffic passes the proxy; nothing listens there unless a proxy runs."""
        return self.port + FRONT_PROXY_OFFSET


class KafkaCluster:
    """One broker (`brokers=1`) or a three-node KRaft cluster (`brokers=3`) of the local stack."""

    def __init__(self, settings: Settings, brokers: int = 1, *,
                 security: ScramTls | None = None) -> None:
        if brokers not in (1, 3):
            raise StackError("The local stack runs 1 or 3 Kafka brokers.")
        self.settings = settings
        self.brokers = brokers
        self.security = security
        root = settings.stack_dir.resolve()
        # A secure node also listens on port + 2 (inter-broker, PLAINTEXT on loopback).
        internal = 2 if security is not None else None
        if brokers == 1:
            self.home = root / ("kafka" if security is None else "kafka-secure")
            port = settings.dev_kafka_port
            self.nodes = [KafkaNode(1, port, port + 1, self.home,
                                    port + internal if internal else None)]
        else:
            self.home = root / ("kafka-cluster" if security is None else "kafka-cluster-secure")
            self.nodes = [KafkaNode(i + 1, port, port + 1, self.home / f"node{i + 1}",
                                    port + internal if internal else None)
                          for i, port in enumerate(settings.dev_cluster_ports)]

    @property
    def name(self) -> str:
        name = "kafka" if self.brokers == 1 else "kafka-cluster"
        return name if self.security is None else f"{name}-secure"

    @property
    def tls(self) -> TlsFiles:
        """The CA and broker certificate files of a secure cluster (made by `up`)."""
        return TlsFiles(self.home / "tls")

    @property
    def bootstrap(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def _render_config(self, node: KafkaNode) -> str:
        single = self.brokers == 1
        voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in self.nodes)
        replication = 1 if single else 3
        min_isr = 1 if single else 2
        if self.security is None or node.internal_port is None:
            # FRONT: a second door for clients that reach the broker through a fault
            # proxy (ops/chaos/netproxy.py): it tells them to come back through the proxy.
            listeners = [
                f"listeners=PLAINTEXT://{HOST}:{node.port},"
                f"CONTROLLER://{HOST}:{node.controller_port},"
                f"FRONT://{HOST}:{node.front_port}",
                f"advertised.listeners=PLAINTEXT://{HOST}:{node.port},"
                f"FRONT://{HOST}:{node.front_proxy_port}",
                "inter.broker.listener.name=PLAINTEXT",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
                "FRONT:PLAINTEXT",
            ]
        else:
            listeners = listener_config(self.security, self.tls, host=HOST, port=node.port,
                                        controller_port=node.controller_port,
                                        internal_port=node.internal_port)
        lines = [
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            *listeners,
            f"log.dirs={node.log_dir}",
            # stream-jobs declares every topic; a typo must fail, not create a topic.
            "auto.create.topics.enable=false",
            "num.partitions=1",
            f"default.replication.factor={replication}",
            f"min.insync.replicas={min_isr}",
            "unclean.leader.election.enable=false",
            f"offsets.topic.replication.factor={replication}",
            f"offsets.topic.num.partitions={5 if single else 10}",
            f"transaction.state.log.replication.factor={replication}",
            f"transaction.state.log.min.isr={min_isr}",
            f"share.coordinator.state.topic.replication.factor={replication}",
            f"share.coordinator.state.topic.min.isr={min_isr}",
            "group.initial.rebalance.delay.ms=0",
            # Room for a 1 MiB payload plus headers and batch overhead.
            "message.max.bytes=2097152",
            "replica.fetch.max.bytes=2097152",
            "log.segment.bytes=67108864",
        ]
        return "\n".join(lines) + "\n"

    def _java(self, lib: Path, *args: str, heap_mb: int | None = None,
              log_config: str = "tools-log4j2.properties") -> list[str]:
        opts = [f"-Dlog4j2.configurationFile={ops_dir() / 'kafka' / log_config}",
                "-Djava.awt.headless=true"]
        if heap_mb is not None:
            opts += [f"-Xms{min(heap_mb, 256)}m", f"-Xmx{heap_mb}m", "-XX:+UseG1GC",
                     "-XX:MaxGCPauseMillis=20", "-XX:+ExplicitGCInvokesConcurrent"]
        else:
            # A tool runs for seconds: the quick compiler and the small collector start
            # it about 40 % sooner than the server defaults.
            opts += ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
        return ["java", *opts, "-cp", f"{lib}/*", *args]

    @property
    def heap_mb(self) -> int:
        """Each node's heap cap: `dev_kafka_heap_mb`, three quarters of it per cluster node."""
        heap = self.settings.dev_kafka_heap_mb
        return heap if self.brokers == 1 else max(256, heap * 3 // 4)

    def server_argv(self, node: KafkaNode, lib: Path) -> list[str]:
        """The command line that runs `node`'s broker from the jars in `lib`."""
        return self._java(lib, "kafka.Kafka", str(node.config), heap_mb=self.heap_mb,
                          log_config="log4j2.properties")

    def _format(self, lib: Path) -> bool:
        """Format the storage of nodes that have none yet; a formatted node is left alone.
        True when every node was formatted now (by these jars)."""
        fresh = not any((node.log_dir / "meta.properties").is_file() for node in self.nodes)
        cluster_id_file = self.home / "cluster.id"
        if not cluster_id_file.is_file():
            cluster_id_file.write_text(random_cluster_id() + "\n")
        cluster_id = cluster_id_file.read_text().strip()
        for node in self.nodes:
            if (node.log_dir / "meta.properties").is_file():
                continue
            node.log_dir.mkdir(parents=True, exist_ok=True)
            # SCRAM credentials go into the first metadata records (KIP-900), so the
            # broker admits its users from its first start on.
            scram = self.security.format_args() if self.security is not None else []
            out = subprocess.run(
                self._java(lib, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                           "-c", str(node.config), "--ignore-formatted", *scram),
                capture_output=True, text=True, check=False,
            )
            if out.returncode != 0:
                detail = (out.stderr or out.stdout).strip()[-400:]
                if self.security is not None:
                    detail = self.security.redact(detail)
                raise StackError(f"Formatting Kafka node {node.node_id} failed: {detail}")
        return fresh

    def _pid(self, node: KafkaNode) -> int | None:
        return read_pid(node.pid_file, marker=str(node.config))

    def up(self) -> None:
        """Start every node that is not running; a second `up` is a no-op. Storage an
        older pinned version formatted starts on the pinned jars and gets their features
        (a running cluster's are left as they are: `up` changes nothing that runs)."""
        lib = resolve_jars(self.settings)
        version = kafka_version(ops_dir() / "kafka" / "pom.xml")
        self._check_jars(lib, version)
        if all(self._pid(node) for node in self.nodes):
            return
        if self.security is not None:
            make_tls_files(self.tls.folder)
        for node in self.nodes:
            node.home.mkdir(parents=True, exist_ok=True)
            node.config.write_text(self._render_config(node))
        if self._format(lib):
            self.features_file.write_text(version + "\n")
        started: list[KafkaNode] = []
        for node in self.nodes:
            if self._pid(node):
                continue
            ports = [node.port, node.controller_port]
            if node.internal_port is not None:
                ports.append(node.internal_port)
            for port in ports:
                ensure_port_free(HOST, port, f"Kafka node {node.node_id}",
                                 "STREAM_JOBS_DEV_KAFKA_PORT")
            spawn(self.server_argv(node, lib), node.log_file, node.pid_file, cwd=node.home)
            started.append(node)
        for node in started:
            wait_until(
                lambda node=node: port_open(HOST, node.port),  # type: ignore[misc]
                alive=lambda node=node: self._pid(node) is not None,  # type: ignore[misc]
                timeout_s=READY_TIMEOUT_S,
                what=f"Kafka node {node.node_id}",
                log_file=node.log_file,
            )
        self._finalize_features(lib, version)

    def _check_jars(self, lib: Path, version: str) -> None:
        """A running node must run the pinned jars: after the pin moves, `up` must not
        leave the old broker serving as if it were the new one."""
        for node in self.nodes:
            pid = self._pid(node)
            if pid is not None and f"{lib}/*" not in cmdline(pid):
                raise StackError(
                    f"Kafka node {node.node_id} (pid {pid}) runs other jars than the "
                    f"{version} that ops/kafka/pom.xml pins: run `stream-jobs dev down`, then "
                    "`stream-jobs dev up` starts it on the pinned jars (its data carries over)."
                )

    @property
    def features_file(self) -> Path:
        """The Kafka version whose features the cluster's metadata was last brought to."""
        return self.home / "features.version"

    def _finalize_features(self, lib: Path, version: str) -> None:
        """Bring the cluster's finalized features (metadata.version, share.version, ...)
        to those a fresh format by these jars sets, once after the pinned version moves:
        a broker started on storage an older one formatted keeps the older levels (no
        share groups on Kafka 4.1's) until they are upgraded, and never downgrades."""
        if self.features_file.is_file() and self.features_file.read_text().strip() == version:
            return
        tool = "org.apache.kafka.tools.FeatureCommand"
        mapping = self._tool(lib, tool, "version-mapping", "--release-version",
                             release_of(version))
        levels = [arg for level in release_features(mapping) for arg in ("--feature", level)]
        # A secure node's PLAINTEXT loopback listener carries the cluster's own requests.
        bootstrap = ",".join(f"{HOST}:{n.internal_port or n.port}" for n in self.nodes)
        self._tool(lib, tool, "--bootstrap-server", bootstrap, "upgrade", *levels)
        self.features_file.write_text(version + "\n")

    def _tool(self, lib: Path, main: str, *args: str) -> str:
        """Run a Kafka tool from `lib`; its stdout, or a StackError saying what failed."""
        out = subprocess.run(self._java(lib, main, *args), capture_output=True, text=True,
                             check=False)
        if out.returncode != 0:
            detail = (out.stderr or out.stdout).strip()[-400:]
            raise StackError(f"{main.rsplit('.', 1)[-1]} {' '.join(args[-3:])} failed: {detail}")
        return out.stdout

    def down(self) -> list[str]:
        """Stop the nodes we started (by pid file); returns what was stopped."""
        running = [(node, pid) for node in self.nodes if (pid := self._pid(node)) is not None]
        # One at a time, the last node has no quorum left and its controlled shutdown sits
        # out the whole grace period; told together, the nodes finish in seconds.
        for _, pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        stopped = []
        for node, pid in running:
            stop_pid(pid)
            stopped.append(f"{self.name} node {node.node_id} (pid {pid})")
        for node in self.nodes:
            node.pid_file.unlink(missing_ok=True)
        return stopped

    def status(self) -> list[ServiceStatus]:
        rows = []
        for node in self.nodes:
            pid = self._pid(node)
            label = self.name if self.brokers == 1 else f"{self.name} node {node.node_id}"
            rows.append(ServiceStatus(
                name=label,
                running=pid is not None and port_open(HOST, node.port),
                pid=pid,
                address=node.address,
                connect=f"STREAM_JOBS_KAFKA_BOOTSTRAP={self.bootstrap}" + (
                    "" if self.security is None else
                    f" STREAM_JOBS_KAFKA_SECURITY_PROTOCOL=SASL_SSL "
                    f"STREAM_JOBS_KAFKA_SASL_MECHANISM={self.security.mechanism} "
                    f"STREAM_JOBS_KAFKA_SSL_CAFILE={self.tls.ca_cert}"),
                log=node.log_file,
            ))
        return rows

    def kill_node(self, node_id: int) -> int:
        """SIGKILL one node (fault tests); returns its pid."""
        node = self.nodes[node_id - 1]
        pid = self._pid(node)
        if pid is None:
            raise StackError(f"Kafka node {node_id} is not running.")
        os.kill(pid, signal.SIGKILL)
        return pid
