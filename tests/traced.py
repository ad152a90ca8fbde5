"""The SDK's in-memory exporter as this process's tracer provider, for tests of the spans
(docs/tracing.md), and questions about what it holds.

OpenTelemetry lets a process set its global provider once; a test that needs its own (or
none) resets the API's globals here, as OpenTelemetry's own tests do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once


def install(provider: TracerProvider | None) -> None:
    """Make `provider` the process's tracer provider (None: none, the API's default)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Spans recorded from now on (workers and clients made after this fixture)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    install(provider)
    try:
        yield exporter
    finally:
        install(None)
        provider.shutdown()


@pytest.fixture
def untraced() -> Iterator[None]:
    """No tracer provider set, whatever an earlier test left."""
    install(None)
    yield
    install(None)


def of_job(spans: Sequence[ReadableSpan], job_id: str) -> list[ReadableSpan]:
    """The spans about job `job_id`, in the order they started."""
    found = [s for s in spans if (s.attributes or {}).get("stream_jobs.job.id") == job_id]
    return sorted(found, key=lambda s: s.start_time or 0)


def kind_of(span: ReadableSpan) -> tuple[SpanKind, str]:
    """(kind, hop) of a send span, (kind, "process") of a process span."""
    attributes = span.attributes or {}
    return span.kind, str(attributes.get("stream_jobs.hop", "process"))


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def linked_to(span: ReadableSpan) -> list[int]:
    return [link.context.span_id for link in span.links]
