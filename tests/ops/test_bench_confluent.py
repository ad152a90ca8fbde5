"""The confluent section of the bench (issue 29, point 4): a confluent-kafka batch as our
records, the prototype of our dispatch (per-key chains, the lowest unfinished offset to
commit, backpressure) and its part of RESULTS.md. No services."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from ops.bench.common import BenchError, Results
from ops.bench.confluent import (
    JOB_TYPE,
    PROPOSE_AT,
    Delivered,
    Prototype,
    by_partition,
    finish_runners,
    outcome,
)
from ops.bench.report import OWN_HEADINGS, render
from ops.bench.report.confluent import confluent_section, proposal
from stream_jobs.kafka import TopicPartition
from stream_jobs.record import JobRecord, Record

TOPIC = "bench.bench.confluent"


@dataclass
class FakeMessage:
    """What confluent-kafka's `Message` gives the bench, through the same methods."""

    topic_: str
    partition_: int
    offset_: int
    key_: bytes | None = b"k"
    value_: bytes | None = b"{}"
    headers_: list[tuple[str, bytes]] | None = None
    error_: object = None

    def error(self) -> object:
        return self.error_

    def topic(self) -> str | None:
        return self.topic_

    def partition(self) -> int | None:
        return self.partition_

    def offset(self) -> int | None:
        return self.offset_

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000 + self.offset_)

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> Any:
        return self.headers_


@dataclass
class FakeRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int = 0


def job_record(partition: int, offset: int, key: bytes | None,
               job_type: str = JOB_TYPE) -> Record:
    """A record of one of our jobs, as `enqueue` writes it."""
    job = JobRecord(job_id=f"job-{partition}-{offset}", job_type=job_type,
                    payload=b'{"n": %d}' % offset, key=key)
    return FakeRecord(TOPIC, partition, offset, key, job.payload, job.headers())


def test_a_batch_is_split_by_partition_in_offset_order() -> None:
    messages = [FakeMessage(TOPIC, 1, 10), FakeMessage(TOPIC, 0, 5), FakeMessage(TOPIC, 1, 11),
                FakeMessage(TOPIC, 0, 6, headers_=[("sj-type", b"x")])]
    batches = by_partition(messages)
    assert list(batches) == [TopicPartition(TOPIC, 1), TopicPartition(TOPIC, 0)]
    assert [r.offset for r in batches[TopicPartition(TOPIC, 1)]] == [10, 11]
    assert [r.offset for r in batches[TopicPartition(TOPIC, 0)]] == [5, 6]
    last = batches[TopicPartition(TOPIC, 0)][1]
    assert (last.topic, last.partition, last.key, last.value, last.timestamp) == (
        TOPIC, 0, b"k", b"{}", 1_006)
    assert list(last.headers) == [("sj-type", b"x")]
    assert by_partition([]) == {}


def test_a_message_without_headers_has_none_and_an_error_is_no_record() -> None:
    assert list(Delivered(FakeMessage(TOPIC, 0, 1, key_=None)).headers) == []
    with pytest.raises(BenchError, match="broker down"):
        by_partition([FakeMessage(TOPIC, 0, 1), FakeMessage(TOPIC, 0, 2, error_="broker down")])


async def test_the_prototype_runs_every_job_and_commits_where_the_partitions_end() -> None:
    proto = Prototype(JOB_TYPE, 7, max_payload_bytes=1_000_000, concurrency=4)
    first = [job_record(0, offset, b"a" if offset % 2 else b"b") for offset in range(3, 8)]
    assert not proto.take(TopicPartition(TOPIC, 0), first)
    # Nothing has finished yet: the lowest unfinished offset is where the tracker started.
    assert proto.due_commits() == {}
    assert not proto.take(TopicPartition(TOPIC, 1), [job_record(1, 0, None),
                                                     job_record(1, 1, None)])
    await asyncio.wait_for(proto.done.wait(), 5)
    await finish_runners(proto)
    assert outcome(proto, "test")["rate"] > 0
    assert proto.due_commits() == {TopicPartition(TOPIC, 0): 8, TopicPartition(TOPIC, 1): 2}
    assert proto.due_commits() == {}  # taken as committed
    assert proto.position_total() == 10  # partition 0 started at offset 3


async def test_a_partition_over_its_buffer_pauses_and_resumes_once_half_drained() -> None:
    proto = Prototype(JOB_TYPE, 6, max_payload_bytes=1_000_000, concurrency=2)
    proto.max_buffered = 4
    tp = TopicPartition(TOPIC, 0)
    assert proto.take(tp, [job_record(0, offset, b"k") for offset in range(6)])
    assert proto.any_paused()
    assert proto.pauses == 1
    await asyncio.wait_for(proto.done.wait(), 5)
    assert proto.resumable() == [tp]
    assert proto.resumable() == []
    assert not proto.any_paused()


async def test_a_record_that_is_not_a_job_stops_the_drain_with_its_reason() -> None:
    proto = Prototype(JOB_TYPE, 2, max_payload_bytes=1_000_000)
    proto.take(TopicPartition(TOPIC, 0), [job_record(0, 0, b"k", job_type="bench.other")])
    await asyncio.wait_for(proto.done.wait(), 5)
    with pytest.raises(BenchError, match=r"not a job.*bench\.other"):
        outcome(proto, "test")


def _results(prototype: float, ours: float, on_aiokafka: float) -> Results:
    results = Results()
    results.add("confluent.ref_aiokafka", "aiokafka", "msg/s", [200_000.0, 220_000.0])
    results.add("confluent.raw_consume", "confluent", "msg/s", [900_000.0, 1_000_000.0])
    results.add("confluent.ref_ours", "ours", "jobs/s", [ours, ours])
    results.add("confluent.noop_key", "prototype", "jobs/s", [prototype, prototype])
    results.add("confluent.proto_aiokafka", "on aiokafka", "jobs/s", [on_aiokafka] * 2)
    results.details["confluent"] = {
        "measured_at": "today", "quick": False, "took_s": 90.0, "nproc": 2, "jobs": 100_000,
        "load_avg_before": 1.0, "load_avg_after": 1.5,
        "versions": {"confluent-kafka": "2.16.2", "librdkafka": "2.16.0"},
        "runs": [{"run": 1, "contender": "proto", "rate": prototype, "load_avg_after": 1.2}],
        "aio_error": "RuntimeError: no loop"}
    return results


def test_the_proposal_answers_the_issue_and_splits_the_gain() -> None:
    below = _results(80_000.0, 70_000.0, 80_000.0).to_json()["figures"]
    assert "**Prototype on confluent-kafka / ours: 1.14x**" in proposal(below)
    assert f"under the issue's {PROPOSE_AT:g}x" in proposal(below)
    assert "client's part (the prototype on confluent-kafka / on aiokafka) is 1.00x" in \
        proposal(below)
    above = _results(150_000.0, 100_000.0, 100_000.0).to_json()["figures"]
    assert "the case for a transport option is made" in proposal(above)
    assert "open" in proposal({})


def test_the_section_has_a_heading_of_its_own_with_its_ratios_runs_and_notes() -> None:
    assert OWN_HEADINGS["confluent"] == "A second Kafka client"
    data = _results(80_000.0, 70_000.0, 80_000.0).to_json()
    lines = confluent_section(data["details"]["confluent"], data["figures"], "BenchError: x")
    text = "\n".join(lines)
    assert lines[0] == "## A second Kafka client"
    assert "| confluent-kafka raw / aiokafka raw | 4.52x |" in text
    assert "confluent-kafka 2.16.2 (librdkafka 2.16.0)" in text
    assert "AIOConsumer did not work here**: RuntimeError: no loop" in text
    assert "**The confluent run failed**: BenchError: x" in text
    data["meta"] = {"started_at": "today", "total_s": 90.0}
    assert "## A second Kafka client" in render(data)
