"""Tracing's pure rules (stream_jobs/tracing/rules.py), the OTEL_* environment it reads
(stream_jobs/tracing/setup.py) and its spans on the SDK's in-memory exporter, without
Kafka: the trace context a record carries, hops and links, and nothing without an SDK."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from stream_jobs.failures import FailureInfo
from stream_jobs.outcomes import Outcome
from stream_jobs.record import JobRecord, trace_id_of
from stream_jobs.tracing import Hop, JobSpans, job_spans
from stream_jobs.tracing import setup as tracing_setup
from stream_jobs.tracing.rules import (
    format_traceparent,
    parse_traceparent,
    process_attributes,
    send_attributes,
    tenant_of,
)
from stream_jobs.tracing.setup import configure_from_env, exporter_names
from tests.traced import exported, install, linked_to, parent_id, span_id, trace_id

__all__ = ["exported"]  # the fixture, used by name

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
JOB = JobRecord(job_id="j-1", job_type="mail.send", payload=b"{}", key=b"k", attempt=2,
                lane="high")


class Consumed:
    topic, partition, offset, timestamp = "jobs.mail.send", 3, 41, 0
    key, value, headers = b"k", b"{}", ()


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 255))
def test_a_traceparent_round_trips(trace: int, span: int, flags: int) -> None:
    text = format_traceparent(trace, span, flags)
    assert parse_traceparent(text) == (trace, span, flags)
    assert trace_id_of(text) == f"{trace:032x}"


@pytest.mark.parametrize("text", [
    None, "", "00-x", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # a version never used
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace ID
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span ID
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more",  # 00 has four fields
    "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
])
def test_what_is_not_a_traceparent_is_none_never_an_error(text: str | None) -> None:
    assert parse_traceparent(text) is None


def test_a_later_version_may_carry_more_fields() -> None:
    found = parse_traceparent(
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes-later")
    assert found is not None
    assert found.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert trace_id_of(TRACEPARENT.upper()) == "0af7651916cd43dd8448eb211c80319c"


def test_first_sends_start_from_the_caller_and_hops_continue_a_job() -> None:
    assert [hop for hop in Hop if not hop.continues] == [Hop.ENQUEUE, Hop.OUTBOX]


def test_attributes_name_the_job_where_it_was_read_and_why_it_was_sent() -> None:
    assert process_attributes(JOB, "jobs.mail.send.high", 3, 41, "jobs.mail.send.worker") == {
        "messaging.system": "kafka", "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "jobs.mail.send.high",
        "messaging.destination.partition.id": "3", "messaging.kafka.offset": 41,
        "messaging.consumer.group.name": "jobs.mail.send.worker",
        "stream_jobs.job.type": "mail.send", "stream_jobs.job.id": "j-1",
        "stream_jobs.job.attempt": 2, "stream_jobs.job.lane": "high"}
    sent = send_attributes("jobs.mail.send.retry-5s", JOB, Hop.RETRY, "5s")
    assert (sent["stream_jobs.hop"], sent["stream_jobs.tier"],
            sent["messaging.operation.type"]) == ("retry", "5s", "send")
    assert "stream_jobs.tenant" not in sent  # a job of no tenant
    assert tenant_of(JOB) is None
    acme = JOB.with_(tenant="acme")
    assert tenant_of(acme) == "acme"
    assert send_attributes("jobs.mail.send", acme, Hop.ENQUEUE)["stream_jobs.tenant"] == "acme"
    assert process_attributes(acme, "jobs.mail.send", 0, 1, "g")["stream_jobs.tenant"] == "acme"


@pytest.mark.parametrize(("env", "names"), [
    ({}, []),
    ({"OTEL_TRACES_EXPORTER": "none"}, []),
    ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_http"]),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     ["otlp_proto_grpc"]),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, ["otlp_proto_http"]),
    ({"OTEL_TRACES_EXPORTER": " Console, otlp ,console"}, ["console", "otlp_proto_http"]),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
])
def test_the_exporters_the_environment_asks_for(env: dict[str, str], names: list[str]) -> None:
    assert exporter_names(env) == names


@pytest.fixture
def no_provider() -> Iterator[None]:
    install(None)
    yield
    install(None)


def test_without_an_sdk_nothing_records(no_provider: None) -> None:
    assert job_spans() is None
    assert configure_from_env({}) is False
    assert job_spans() is None


def test_the_environment_sets_the_sdk_up_once(no_provider: None) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "mail-worker"}
    assert configure_from_env(env) is True
    provider = trace.get_tracer_provider()
    assert provider.resource.attributes["service.name"] == "mail-worker"  # type: ignore[attr-defined]
    assert job_spans() is not None
    assert configure_from_env(env) is False  # a provider is set: it is kept
    provider.shutdown()  # type: ignore[attr-defined]


def test_an_sdk_asked_for_but_not_installed_is_one_warning(
        no_provider: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def missing(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(tracing_setup, "import_module", missing)
    with caplog.at_level(logging.WARNING, logger="stream_jobs.tracing"):
        assert configure_from_env({"OTEL_TRACES_EXPORTER": "otlp"}) is False
    assert len(caplog.records) == 1
    assert "pip install 'stream-jobs[otel]'" in caplog.records[0].getMessage()
    assert job_spans() is None


def test_an_exporter_no_package_provides_is_a_warning(
        no_provider: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="stream_jobs.tracing"):
        assert configure_from_env({"OTEL_TRACES_EXPORTER": "zipkin-nowhere"}) is False
    assert "zipkin-nowhere" in caplog.text
    assert job_spans() is None


def _spans() -> JobSpans:
    spans = job_spans()
    assert spans is not None
    return spans


async def test_an_attempt_is_a_child_of_its_record_and_its_hop_links_to_it(
        exported: InMemorySpanExporter) -> None:
    spans = _spans()
    job = JOB.with_(traceparent=TRACEPARENT)
    written: list[JobRecord] = []

    async def write(topic: str, record: JobRecord) -> None:
        written.append(record)

    async def run() -> Outcome:
        spans.attempt_failed(RuntimeError("boom"))
        await spans.send(write, "jobs.mail.send.retry-5s", job, Hop.RETRY, tier="5s")
        return Outcome.RETRIED

    assert await spans.attempt(job, Consumed(), "jobs.mail.send.worker", run) \
        is Outcome.RETRIED
    retry, attempt = exported.get_finished_spans()
    assert (attempt.kind, retry.kind) == (SpanKind.CONSUMER, SpanKind.PRODUCER)
    assert trace_id(attempt) == 0x0AF7651916CD43DD8448EB211C80319C
    assert parent_id(attempt) == 0xB7AD6B7169203331
    assert parent_id(retry) == span_id(attempt)
    assert linked_to(retry) == [span_id(attempt)]
    assert (attempt.attributes or {})["stream_jobs.job.outcome"] == "retried"
    # The retry's record carries the retry's span: the next attempt is its child.
    assert written[0].traceparent is not None
    assert parse_traceparent(written[0].traceparent)[:2] == (  # type: ignore[index]
        trace_id(retry), span_id(retry))


async def test_an_enqueue_under_no_span_starts_a_trace_and_a_letter_ends_dead_lettered(
        exported: InMemorySpanExporter) -> None:
    spans = _spans()
    assert spans.current_traceparent() is None

    class Placed:
        partition, offset = 4, 99

    async def write_many(items: list[tuple[str, JobRecord]]) -> list[Placed]:
        return [Placed() for _ in items]

    await spans.send_many(write_many, [("jobs.mail.send", JOB)], Hop.ENQUEUE)

    async def dies() -> FailureInfo:
        return FailureInfo("max-attempts", "RuntimeError", "boom", "", 1)

    await spans.attempt(JOB, Consumed(), "g", dies)
    sent, attempt = exported.get_finished_spans()
    assert sent.parent is None and attempt.parent is None  # noqa: PT018 - one fact
    assert (sent.attributes or {})["messaging.destination.partition.id"] == "4"
    assert (attempt.attributes or {})["stream_jobs.job.outcome"] == "dead_lettered"
