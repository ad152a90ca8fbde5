"""Kafka's own ceiling on this box: ProducerPerformance, ConsumerPerformance and
EndToEndLatency from the broker's jars, on a 6-partition topic made by our admin."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ops.bench.common import Bench, BenchError, run_async
from stream_jobs.settings import Settings
from stream_jobs.stack.kafka import ops_dir, resolve_jars

TOOL_TIMEOUT_S = 300.0


def java(lib: Path, main: str, *args: str) -> list[str]:
    log_config = ops_dir() / "kafka" / "tools-log4j2.properties"
    return ["java", f"-Dlog4j2.configurationFile={log_config}", "-Xmx512m",
            "-cp", f"{lib}/*", main, *args]


def run_tool(argv: list[str], timeout_s: float = TOOL_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{argv[-1]}... did not finish within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv[5:7])} failed: {done.stderr.strip()[-600:]}")
    return done.stdout


def producer_props(settings: Settings) -> list[str]:
    """The producer settings of stream-jobs' JobProducer, in Java's spelling."""
    return [f"bootstrap.servers={settings.kafka_bootstrap}", "acks=all",
            "enable.idempotence=true", f"linger.ms={settings.producer_linger_ms}",
            f"batch.size={min(settings.producer_max_batch_bytes, 16 * 1024 * 1024)}"]


def kafka_tools(b: Bench, record_bytes: int) -> None:
    s = b.settings()
    run_async(b.declare("bench.kafka-perf"), 60)
    run_async(b.declare("bench.kafka-e2e"), 60)
    lib = resolve_jars(b.base)
    perf_topic = f"{b.prefix}.bench.kafka-perf"
    e2e_topic = f"{b.prefix}.bench.kafka-e2e"
    n = b.scale.kafka_tool_records
    produced: list[float] = []
    consumed: list[float] = []
    e2e_p50: list[float] = []
    e2e_p99: list[float] = []
    for run in range(b.scale.runs):
        out = run_tool(java(lib, "org.apache.kafka.tools.ProducerPerformance",
                            "--topic", perf_topic, "--num-records", str(n),
                            "--record-size", str(record_bytes), "--throughput", "-1",
                            "--producer-props", *producer_props(s)))
        match = re.findall(r"([\d.]+) records/sec", out)
        if not match:
            raise BenchError(f"ProducerPerformance printed no rate: {out[-400:]}")
        produced.append(float(match[-1]))

        out = run_tool(java(lib, "org.apache.kafka.tools.ConsumerPerformance",
                            "--bootstrap-server", s.kafka_bootstrap, "--topic", perf_topic,
                            "--messages", str(n), "--group", f"{b.prefix}.perf-consume-{run}",
                            "--timeout", "60000", "--hide-header"))
        row = [c.strip() for c in out.strip().splitlines()[-1].split(",")]
        if len(row) < 10 or float(row[4]) < n:
            raise BenchError(f"ConsumerPerformance read too little: {out[-400:]}")
        consumed.append(float(row[9]))  # fetch.nMsg.sec: without the group join

        out = run_tool(java(lib, "org.apache.kafka.tools.EndToEndLatency", s.kafka_bootstrap,
                            e2e_topic, str(b.scale.kafka_e2e_messages), "all",
                            str(record_bytes)))
        found = re.search(r"50th = (\d+), 99th = (\d+)", out)
        if found is None:
            raise BenchError(f"EndToEndLatency printed no percentiles: {out[-400:]}")
        e2e_p50.append(float(found.group(1)))
        e2e_p99.append(float(found.group(2)))

    r = b.results
    r.add("kafka.produce", "Kafka ProducerPerformance", "records/s", produced,
          f"{n:,} records of {record_bytes} B, our producer settings")
    r.add("kafka.consume", "Kafka ConsumerPerformance", "records/s", consumed,
          f"{n:,} records, fetch rate (group join excluded)")
    r.add("kafka.e2e_p50", "Kafka EndToEndLatency p50", "ms", e2e_p50,
          f"{b.scale.kafka_e2e_messages:,} round trips, acks=all, linger 0, whole-ms resolution")
    r.add("kafka.e2e_p99", "Kafka EndToEndLatency p99", "ms", e2e_p99,
          "produce, then poll until it arrives, one message at a time")
