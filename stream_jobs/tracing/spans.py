"""The spans of a job's life, recorded through the OpenTelemetry API.

`job_spans()` answers once, when a worker, relay, client or tool is made, whether anything
records spans in this process: None when no SDK is configured (the API's default
provider), so the hot path then pays one `is None` test per job and nothing else.

- A *send* span (PRODUCER) for every record written: an enqueue, an outbox row, a
  firing, and each hop of a job already under way (a retry to its delay tier, a dead
  letter, a release from a tier, a requeue, a replay). The record's `traceparent` becomes
  the send span's context, so what reads the record next is its child.
- A *process* span (CONSUMER) per attempt, a child of the record's `traceparent`,
  current while the attempt runs: a child job enqueued in `ctx.once()` and the attempt's
  own retry or dead letter are its children, in its trace.
- A hop's send span also links to the attempt before it: the attempt that failed (for a
  retry or a dead letter, which carry that attempt's context on, `attempt_trace`), or
  for what the relay, `dlq requeue` or `replay` moves, the attempt its record came from
  (the record's own write where it names none: a replayed lane record).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import Token
from typing import Protocol, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    ProxyTracer,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)

from stream_jobs.failures import FailureInfo
from stream_jobs.outcomes import Outcome
from stream_jobs.record import JobRecord, Record
from stream_jobs.tracing.rules import (
    LINK_ATTEMPT_BEFORE,
    LINK_KIND,
    OUTCOME,
    PROCESS,
    SEND,
    Hop,
    format_traceparent,
    parse_traceparent,
    process_attributes,
    send_attributes,
    span_name,
    written_attributes,
)

T = TypeVar("T")
P = TypeVar("P", bound="Placed")
INSTRUMENTATION = "stream_jobs"


class Placed(Protocol):
    """Where the broker put a record (the producer's `Written`)."""

    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


def job_spans() -> JobSpans | None:
    """This process's job spans, or None when no tracer provider that records is set (no
    SDK configured, or `OTEL_SDK_DISABLED`): then nothing of a job's path is traced."""
    tracer = trace.get_tracer(INSTRUMENTATION)
    if isinstance(tracer, ProxyTracer | trace.NoOpTracer):
        return None
    return JobSpans(tracer)


def span_context_of(traceparent: str | None) -> SpanContext | None:
    """The remote span context a record's `traceparent` names, or None."""
    found = parse_traceparent(traceparent)
    if found is None:
        return None
    return SpanContext(found.trace_id, found.span_id, is_remote=True,
                       trace_flags=TraceFlags(found.flags))


def traceparent_of(span: Span) -> str:
    found = span.get_span_context()
    return format_traceparent(found.trace_id, found.span_id, found.trace_flags)


class SendSpan:
    """One record's send span, started: `job` carries it as its `traceparent`."""

    __slots__ = ("job", "span")

    def __init__(self, span: Span, job: JobRecord) -> None:
        self.span = span
        self.job = job

    def written(self, placed: Placed) -> None:
        """The broker acknowledged the record there: the span ends."""
        self.span.set_attributes(written_attributes(placed.partition, placed.offset))
        self.span.end()

    def failed(self, error: BaseException) -> None:
        _failed(self.span, error)
        self.span.end()


class OpenAttempt:
    """An attempt's process span while the attempt runs (current in its task)."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span, token: Token[otel_context.Context]) -> None:
        self.span = span
        self.token = token

    def ended(self, ended: object) -> None:
        """The attempt ended as `ended` (an outcome, or a dead letter's failure)."""
        otel_context.detach(self.token)
        self.span.set_attribute(OUTCOME, _outcome(ended))
        self.span.end()

    def failed(self, error: BaseException) -> None:
        """The attempt raised `error` (torn down, revoked): no outcome was recorded."""
        otel_context.detach(self.token)
        _failed(self.span, error)
        self.span.end()


class JobSpans:
    """Starts the spans of jobs on `tracer` (see the module's docstring)."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    # -- sending ----------------------------------------------------------------------------

    def start_send(self, topic: str, job: JobRecord, hop: Hop, *, tier: str | None = None
                   ) -> SendSpan:
        """The send span of `job` to `topic`, started. A first send (enqueue, outbox,
        firing) is a child of the trace context the job carries (a parent job's attempt,
        the caller's request), else of the current span. A hop in an attempt (a retry, a
        dead letter) is its child, links to it and carries its context on; a hop that
        moves a record (release, requeue, replay) is a child of the record's write and
        links to the attempt the record came from (else to that write)."""
        current = trace.get_current_span().get_span_context()
        carried = span_context_of(job.traceparent)
        links: list[Link] = []
        if hop.continues:
            if current.is_valid:
                before: SpanContext | None = current
                parent = _context(current)
                job = job.with_(attempt_trace=traceparent_of(trace.get_current_span()))
            else:
                before = span_context_of(job.attempt_trace) or carried
                parent = _context(carried)
            if before is not None:
                links.append(Link(before, {LINK_KIND: LINK_ATTEMPT_BEFORE}))
        else:
            parent = _context(carried) if carried is not None else None
        span = self._tracer.start_span(span_name(SEND, topic), context=parent,
                                       kind=SpanKind.PRODUCER, links=links,
                                       attributes=send_attributes(topic, job, hop, tier))
        return SendSpan(span, job.with_(traceparent=traceparent_of(span)))

    async def send(self, write: Callable[[str, JobRecord], Awaitable[T]], topic: str,
                   job: JobRecord, hop: Hop, *, tier: str | None = None) -> T:
        """`write(topic, job)` in its send span; the span ends with the acknowledgement
        (with the partition and offset, when `write` answers them)."""
        sending = self.start_send(topic, job, hop, tier=tier)
        try:
            placed = await write(topic, sending.job)
        except BaseException as exc:
            sending.failed(exc)
            raise
        if _is_placed(placed):
            sending.written(placed)  # type: ignore[arg-type]
        else:
            sending.span.end()
        return placed

    async def send_many(self, write_many: Callable[[list[tuple[str, JobRecord]]],
                                                   Awaitable[Sequence[P]]],
                        items: Sequence[tuple[str, JobRecord]], hop: Hop) -> Sequence[P]:
        """`write_many(items)`, each record in its send span (see `send`)."""
        sendings = [self.start_send(topic, job, hop) for topic, job in items]
        try:
            placed = await write_many([(topic, sending.job) for (topic, _), sending
                                       in zip(items, sendings, strict=True)])
        except BaseException as exc:
            for sending in sendings:
                sending.failed(exc)
            raise
        for sending, where in zip(sendings, placed, strict=True):
            sending.written(where)
        return placed

    # -- processing -------------------------------------------------------------------------

    def begin_attempt(self, job: JobRecord, record: Record, group: str) -> OpenAttempt:
        """The process span of one attempt of `job`, started and made current until the
        attempt's `ended` or `failed` (the worker calls its phases between)."""
        carried = span_context_of(job.traceparent)
        # A fresh context, not the runner's: an attempt is a child of its record only.
        parent = _context(carried) if carried is not None else otel_context.Context()
        span = self._tracer.start_span(
            span_name(PROCESS, record.topic), context=parent, kind=SpanKind.CONSUMER,
            attributes=process_attributes(job, record.topic, record.partition,
                                          record.offset, group))
        return OpenAttempt(span, otel_context.attach(trace.set_span_in_context(span)))

    async def attempt(self, job: JobRecord, record: Record, group: str,
                      run: Callable[[], Awaitable[T]]) -> T:
        """`run()`, one attempt of `job`, in its process span, current meanwhile; the
        span says how it ended (`stream_jobs.job.outcome`)."""
        open_attempt = self.begin_attempt(job, record, group)
        try:
            ended = await run()
        except BaseException as exc:
            open_attempt.failed(exc)
            raise
        open_attempt.ended(ended)
        return ended

    @staticmethod
    def attempt_failed(error: BaseException) -> None:
        """The current attempt's handler failed with `error` (it is retried or
        dead-lettered): its process span records it."""
        _failed(trace.get_current_span(), error)

    @staticmethod
    def current_traceparent() -> str | None:
        """The `traceparent` of the current span, for a job enqueued under it (a child job
        in `ctx.once()`, a job a request handler enqueues), or None."""
        span = trace.get_current_span()
        return traceparent_of(span) if span.get_span_context().is_valid else None


def _context(span_context: SpanContext | None) -> otel_context.Context | None:
    if span_context is None:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_context), otel_context.Context())


@contextmanager
def _current(span: Span) -> Iterator[None]:
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


def _failed(span: Span, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def _outcome(ended: object) -> str:
    if isinstance(ended, FailureInfo):
        return Outcome.DEAD_LETTERED.value
    return str(ended)


def _is_placed(value: object) -> bool:
    return hasattr(value, "partition") and hasattr(value, "offset")


__all__ = ["JobSpans", "OpenAttempt", "SendSpan", "job_spans", "span_context_of", "traceparent_of"]
