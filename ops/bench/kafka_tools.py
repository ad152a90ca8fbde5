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


def producer_performance(lib: Path, s: Settings, topic: str, n: int, record_bytes: int) -> float:
    """ProducerPerformance's records/s for `n` records of `record_bytes`, our settings."""
    out = run_tool(java(lib, "org.apache.kafka.tools.ProducerPerformance",
                        "--topic", topic, "--num-records", str(n),
                        "--record-size", str(record_bytes), "--throughput", "-1",
                        "--producer-props", *producer_props(s)))
    match = re.findall(r"([\d.]+) records/sec", out)
    if not match:
        raise BenchError(f"ProducerPerformance printed no rate: {out[-400:]}")
    return float(match[-1])


def consumer_performance(lib: Path, s: Settings, topic: str, n: int, group: str) -> float:
    """ConsumerPerformance's fetch rate (records/s without the group join) over `n`."""
    out = run_tool(java(lib, "org.apache.kafka.tools.ConsumerPerformance",
                        "--bootstrap-server", s.kafka_bootstrap, "--topic", topic,
                        "--messages", str(n), "--group", group,
                        "--timeout", "60000", "--hide-header"))
    row = [c.strip() for c in out.strip().splitlines()[-1].split(",")]
    if len(row) < 10 or float(row[4]) < n:
        raise BenchError(f"ConsumerPerformance read too little: {out[-400:]}")
    return float(row[9])  # fetch.nMsg.sec: without the group join


def end_to_end_latency(lib: Path, s: Settings, topic: str, n: int,
                       record_bytes: int) -> tuple[float, float]:
    """EndToEndLatency's p50 and p99 in ms over `n` round trips, acks=all."""
    out = run_tool(java(lib, "org.apache.kafka.tools.EndToEndLatency", s.kafka_bootstrap,
                        topic, str(n), "all", str(record_bytes)))
    found = re.search(r"50th = (\d+), 99th = (\d+)", out)
    if found is None:
        raise BenchError(f"EndToEndLatency printed no percentiles: {out[-400:]}")
    return float(found.group(1)), float(found.group(2))


def kafka_tools(b: Bench, record_bytes: int) -> None:
    s = b.settings()
    run_async(b.declare("bench.kafka-perf"), 60)
    run_async(b.declare("bench.kafka-e2e"), 60)
    lib = resolve_jars(b.base)
    perf_topic = f"{b.prefix}.bench.kafka-perf"
    e2e_topic = f"{b.prefix}.bench.kafka-e2e"
    n = b.scale.kafka_tool_records
    trips = b.scale.kafka_e2e_messages
    found: dict[str, list[float]] = {"produce": [], "consume": [], "e2e_p50": [],
                                     "e2e_p99": []}
    for run in range(b.scale.runs):
        found["produce"].append(producer_performance(lib, s, perf_topic, n, record_bytes))
        found["consume"].append(consumer_performance(
            lib, s, perf_topic, n, f"{b.prefix}.perf-consume-{run}"))
        p50, p99 = end_to_end_latency(lib, s, e2e_topic, trips, record_bytes)
        found["e2e_p50"].append(p50)
        found["e2e_p99"].append(p99)
    for key, label, unit, note in (
            ("produce", "Kafka ProducerPerformance", "records/s",
             f"{n:,} records of {record_bytes} B, our producer settings"),
            ("consume", "Kafka ConsumerPerformance", "records/s",
             f"{n:,} records, fetch rate (group join excluded)"),
            ("e2e_p50", "Kafka EndToEndLatency p50", "ms",
             f"{trips:,} round trips, acks=all, linger 0, whole-ms resolution"),
            ("e2e_p99", "Kafka EndToEndLatency p99", "ms",
             "produce, then poll until it arrives, one message at a time")):
        b.results.add(f"kafka.{key}", label, unit, found[key], note)
