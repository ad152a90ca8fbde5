"""Traces across the whole life of a job (docs/tracing.md): OpenTelemetry spans for every
enqueue, attempt and hop, on whatever tracer provider the process has.

`rules` is pure (attribute names, the W3C trace context, the kinds of hop), `spans`
starts the spans through the OpenTelemetry API, `setup` configures the SDK from the
standard `OTEL_*` environment at a process's start.
"""

from stream_jobs.tracing.rules import Hop
from stream_jobs.tracing.spans import JobSpans, job_spans

__all__ = ["Hop", "JobSpans", "job_spans"]
