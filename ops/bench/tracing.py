"""What tracing costs the no-op path (`BENCH_ONLY=tracing`), side by side on one backlog.

One backlog, filled by a traced client (so every record carries a `traceparent`, as it
would from an application that traces), drained by a no-op handler in three contenders;
the goal's two (without the tracing code, unconfigured) interleaved in rounds
(ops/bench/paired.py: the order turned each round, the load average after each drain),
then the SDK's in each of the usual runs:

- **without the tracing code**: the worker's per-job path without tracing,
  `Worker.handle` replaced for that drain by its body minus the tracing (decode, then
  the three phases with the history's timing: no `spans` test, no try around them);
  the client, relay and retries are off this path.
  The `traceparent` header is decoded on every path alike.
- **tracing unconfigured** (the default): the API only, no tracer provider set, so
  `job_spans()` is None and each job pays the `is None` test.
- **SDK, no-op exporter**: the SDK's `TracerProvider` with a `BatchSpanProcessor` whose
  exporter drops every batch: a process span per job, a child of its record's context,
  made current while the handler runs, ended with its outcome (what a traced worker pays
  before any network).

Rates run from the first handler call to the last, as in the processing section; each
drain checks that every job ran once. OpenTelemetry sets a process's provider once: the
bench swaps it between drains the way its tests do (`tests/traced.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.util._once import Once

from ops.bench.backlog import fill, rewind_worker_group
from ops.bench.common import Bench, run_async
from ops.bench.ours import drain
from ops.bench.paired import PAIRS, QUICK_PAIRS, interleave
from stream_jobs.clock import now_ms
from stream_jobs.errors import BadRecord
from stream_jobs.outcomes import Outcome
from stream_jobs.record import decode_record
from stream_jobs.retry_now.rules import released_original
from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.worker import Ended, Worker
from stream_jobs.settings import Settings

HEADING = "Tracing"
INTRO = ("What tracing costs a no-op worker, side by side in one run "
         "(ops/bench/tracing.py says how; docs/tracing.md).")
PREFIX = "tracing."
NOOP = "bench.tracing"
CONTENDERS = ["bypassed", "unconfigured", "sdk"]
GOALS = [  # (text, numerator or figure, denominator or None, op, target, unit)
    ("no-op with tracing unconfigured >= 0.97x without the tracing code",
     "tracing.noop_unconfigured", "tracing.noop_bypassed", ">=", 0.97, "x"),
]


class DroppingExporter(SpanExporter):
    """An exporter that drops what it is given: the SDK's cost without a collector's."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _install(provider: TracerProvider | None) -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


@contextmanager
def _sdk() -> Iterator[None]:
    """The SDK with a no-op exporter as this process's tracer provider meanwhile."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    _install(provider)
    try:
        yield
    finally:
        _install(None)
        provider.shutdown()


async def _untraced_handle(self: Worker, work: PartitionWork, record: Any,
                           runner: Runner) -> None:
    """`Worker.handle` without tracing: the three phases and the history's timing, as
    `Worker.handle` runs them, with no `spans` test and no attempt span around them."""
    try:
        job = decode_record(key=record.key, value=record.value, headers=record.headers,
                            expected_type=self.policy.job_type,
                            max_payload_bytes=self.policy.payload_limit(self.settings),
                            check_json=False)
    except BadRecord as bad:
        await self._not_a_job(record, bad)
        return
    released = self.admission.released
    if released and released_original(record.headers, released):
        self.slots.tick(now_ms())
        self.outcomes[Outcome.DUPLICATE] += 1
        return
    ended: Ended | None = await self._admit(job)
    if ended is None:
        started = time.time()
        dwell_s = started - max(job.enqueued_at_ms, job.not_before_ms or 0) / 1000
        ended = await self._run(job, record, runner, started)
        await self._end(job, ended, started, dwell_s)
    else:
        await self._end(job, ended)


@contextmanager
def _bypassed() -> Iterator[None]:
    traced = Worker.handle
    Worker.handle = _untraced_handle  # type: ignore[method-assign]
    try:
        yield
    finally:
        Worker.handle = traced  # type: ignore[method-assign]


@contextmanager
def _unconfigured() -> Iterator[None]:
    _install(None)
    yield


CONTEXTS = {"bypassed": _bypassed, "unconfigured": _unconfigured, "sdk": _sdk}


def _drain(s: Settings, kind: str, n: int) -> float:
    """One drain of the contender `kind` (CONTENDERS): its jobs/s."""
    with CONTEXTS[kind]():
        rate = run_async(drain(s, NOOP, n), 960)["rate"]
    run_async(rewind_worker_group(s, NOOP), 60)
    return rate


def tracing(b: Bench) -> None:
    s = b.settings()
    # The whole processing backlog: a no-op drain of a quarter of it lasted under a second
    # here, too short to tell 3% apart.
    n = b.scale.backlog_n
    run_async(b.declare(NOOP), 60)
    with _sdk():  # a traced client: every record carries its enqueue's context
        run_async(fill(s, NOOP, n), 600)
    goal = interleave(CONTENDERS[:2], lambda kind: _drain(s, kind, n),
                      QUICK_PAIRS if b.quick else PAIRS, "tracing")
    sdk = []
    for _ in range(b.scale.runs):
        sdk.append(_drain(s, "sdk", n))
        print(f"[bench] tracing sdk: {sdk[-1]:,.0f} jobs/s", flush=True)
    note = f"{n:,} jobs backlog (each with a traceparent), concurrency 64, ordering=key"
    rounds = f"; {len(goal.values['bypassed'])} interleaved rounds"
    r = b.results
    r.add("tracing.noop_bypassed",
          "no-op, without the tracing code (Worker.handle minus its spans)", "jobs/s",
          goal.values["bypassed"], note + rounds, loads=goal.loads["bypassed"])
    r.add("tracing.noop_unconfigured", "no-op, tracing unconfigured (the default)", "jobs/s",
          goal.values["unconfigured"], note + rounds, loads=goal.loads["unconfigured"])
    r.add("tracing.noop_sdk", "no-op, the SDK with a no-op exporter (a span per job)",
          "jobs/s", sdk, f"{note}; BatchSpanProcessor, spans dropped by the exporter")


RATIOS = [
    ("no-op, tracing unconfigured / without the tracing code", "tracing.noop_unconfigured",
     "tracing.noop_bypassed"),
    ("no-op, SDK + no-op exporter / tracing unconfigured", "tracing.noop_sdk",
     "tracing.noop_unconfigured"),
]


__all__ = ["GOALS", "HEADING", "INTRO", "PREFIX", "RATIOS", "tracing"]
