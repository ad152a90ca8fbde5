"""Moving the pinned Kafka on a machine that ran the stack before: the old pin's jars in
the cache, a broker the old version formatted and wrote. A stack of its own, in a folder
of its own on ports of its own (the shared broker is never touched). The old jars come
from the machine's cache (Maven resolves them once if it has none)."""

from __future__ import annotations

import re
import shutil
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_jobs.errors import StackError
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster
from stream_jobs.stack.kafka import kafka_version, resolve_jars
from stream_jobs.stack.process import cmdline
from tests.integration.test_dev_stack import free_port

REPO = Path(__file__).resolve().parents[2]
OLD = "4.1.1"
FEATURES = "org.apache.kafka.tools.FeatureCommand"


def old_checkout(root: Path) -> Path:
    """ops/kafka as it was when the project pinned Kafka 4.1.1 (only the version differs)."""
    shutil.copytree(REPO / "ops" / "kafka", root / "ops" / "kafka")
    pom = root / "ops" / "kafka" / "pom.xml"
    pom.write_text(re.sub(r"<kafka\.version>[^<]+<", f"<kafka.version>{OLD}<",
                          pom.read_text()))
    return root


def finalized(cluster: KafkaCluster, lib: Path) -> dict[str, str]:
    """Each feature's finalized level, as `kafka-features describe` prints it."""
    text = cluster._tool(lib, FEATURES, "--bootstrap-server", cluster.bootstrap, "describe")
    return dict(re.findall(r"Feature: (\S+)\s.*?FinalizedVersionLevel: (\S+)", text))


def jars_of(cluster: KafkaCluster) -> str:
    pid = cluster.status()[0].pid
    assert pid is not None
    found = re.search(r"/kafka-([0-9.]+)-[0-9a-f]+/lib/\*", cmdline(pid))
    assert found, cmdline(pid)
    return found.group(1)


async def read_back(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[bytes]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                group_id=f"upgrade-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            values = [r.value for records in batches.values() for r in records if r.value]
            if values:
                await consumer.commit()
                return values
        raise AssertionError(f"nothing read back from {topic} within {timeout_s:.0f} s")
    finally:
        await consumer.stop()


async def test_a_broker_the_old_pin_wrote_moves_to_the_pinned_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = kafka_version(REPO / "ops" / "kafka" / "pom.xml")
    settings = Settings(stack_dir=tmp_path / "stack", dev_kafka_port=free_port(span=2),
                        dev_kafka_heap_mb=384)
    cluster = KafkaCluster(settings, 1)
    topic = "upgrade.kept"
    try:
        monkeypatch.chdir(old_checkout(tmp_path / "old"))
        cluster.up()
        assert jars_of(cluster) == OLD
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 1, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"written by 4.1.1")
        finally:
            await producer.stop()
        assert await read_back(cluster.bootstrap, topic) == [b"written by 4.1.1"]
        old_features = finalized(cluster, resolve_jars(settings))
        assert old_features["metadata.version"].startswith("4.1-")
        assert old_features["share.version"] == "0"

        # The pin moved: the old broker still runs, and `up` says so instead of using it.
        monkeypatch.chdir(REPO)
        with pytest.raises(StackError, match=f"runs other jars than the {pinned}"):
            cluster.up()
        cluster.down()
        cluster.up()
        assert jars_of(cluster) == pinned
        assert await read_back(cluster.bootstrap, topic) == [b"written by 4.1.1"]
        features = finalized(cluster, resolve_jars(settings))
        assert features["metadata.version"].startswith(pinned.rsplit(".", 1)[0] + "-")
        assert int(features["share.version"]) >= 1, features
        assert features["kraft.version"] == "0"
        assert cluster.features_file.read_text().strip() == pinned
    finally:
        cluster.down()
