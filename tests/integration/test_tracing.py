"""Traces across the whole life of a job, on the real stack, read from the SDK's in-memory
exporter (docs/tracing.md): an enqueue's send span, a process span per attempt, each hop's
send span, parented and linked; a child job in its parent's trace; the outbox, a firing,
the gateway, `dlq requeue` and `replay` in the trace; and nothing at all without an SDK."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from stream_jobs import logs
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.dlq.requeue import SelectAll, requeue
from stream_jobs.errors import PermanentError
from stream_jobs.gateway import create_app
from stream_jobs.naming import dlq_topic, lane_topic, worker_group
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.record import HEADER_TRACEPARENT
from stream_jobs.schedules import Scheduler
from stream_jobs.settings import Settings
from stream_jobs.tools.replay import replay
from stream_jobs.tracing import job_spans
from tests.integration.database import connect
from tests.traced import kind_of, linked_to, of_job, parent_id, span_id, trace_id
from tests.waiting import until

from .conftest import Declare
from .test_cancel_surfaces import _cli
from .test_gateway import AUTH, TOKEN, _gateway_settings, served
from .test_job_status import cli_job
from .topic_reader import read_topic

PRODUCER, CONSUMER = SpanKind.PRODUCER, SpanKind.CONSUMER


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_a_job_failing_twice_then_succeeding_is_one_trace_parented_and_linked(
        app: App, declare: Declare, settings: Settings,
        exported: InMemorySpanExporter) -> None:
    await declare("traced.flaky", partitions=1, retry_tiers=["1s", "2s"], max_attempts=4)

    @app.job("traced.flaky")
    async def flaky(job: dict[str, str], ctx: JobContext) -> None:
        if ctx.attempt < 3:
            raise RuntimeError(f"boom {ctx.attempt}")

    async with app.client() as client:
        job_id = await client.enqueue("traced.flaky", {"name": "flaky"})
    worker = app.worker("traced.flaky")
    await worker.run(until_idle=True)
    assert worker.outcomes["succeeded"] == 1

    spans = of_job(exported.get_finished_spans(), job_id)
    assert [kind_of(s) for s in spans] == [
        (PRODUCER, "enqueue"),
        (CONSUMER, "process"), (PRODUCER, "retry"), (PRODUCER, "release"),
        (CONSUMER, "process"), (PRODUCER, "retry"), (PRODUCER, "release"),
        (CONSUMER, "process")]
    enqueue, p1, retry1, release1, p2, retry2, release2, p3 = spans
    assert len({trace_id(s) for s in spans}) == 1  # one trace
    assert enqueue.parent is None  # enqueued under no span: the trace's root
    # Each span is a child of the one whose record it read or in which it was written.
    chain = [enqueue, p1, retry1, release1, p2, retry2, release2, p3]
    for before, after in itertools.pairwise(chain):
        assert parent_id(after) == span_id(before), (after.name, before.name)
    # A hop links to the attempt before it: the retry and its release both to the attempt
    # that failed.
    assert linked_to(retry1) == linked_to(release1) == [span_id(p1)]
    assert linked_to(retry2) == linked_to(release2) == [span_id(p2)]
    assert linked_to(enqueue) == linked_to(p1) == []

    lane = lane_topic(settings.topic_prefix, "traced.flaky")
    assert [_attributes(p)["stream_jobs.job.attempt"] for p in (p1, p2, p3)] == [1, 2, 3]
    assert [_attributes(p)["stream_jobs.job.outcome"] for p in (p1, p2, p3)] == [
        "retried", "retried", "succeeded"]
    assert [p.status.status_code for p in (p1, p2, p3)] == [
        StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]
    assert p1.events[0].name == "exception"
    first = _attributes(p1)
    assert {k: first[k] for k in ("messaging.system", "messaging.operation.type",
                                  "messaging.destination.name", "messaging.consumer.group.name",
                                  "stream_jobs.job.type", "stream_jobs.job.id")} == {
        "messaging.system": "kafka", "messaging.operation.type": "process",
        "messaging.destination.name": lane,
        "messaging.consumer.group.name": worker_group(settings.topic_prefix, "traced.flaky"),
        "stream_jobs.job.type": "traced.flaky", "stream_jobs.job.id": job_id}
    assert (first["messaging.destination.partition.id"], first["messaging.kafka.offset"]) == (
        "0", 0)
    assert (p1.name, enqueue.name) == (f"process {lane}", f"send {lane}")
    assert [_attributes(s)["stream_jobs.tier"] for s in (retry1, release1, retry2, release2)] \
        == ["1s", "1s", "2s", "2s"]
    sent = _attributes(enqueue)
    assert (sent["messaging.operation.type"], sent["messaging.destination.partition.id"],
            sent["messaging.kafka.offset"]) == ("send", "0", 0)


async def test_a_child_enqueued_in_ctx_once_continues_its_parents_trace(
        app: App, declare: Declare, settings: Settings,
        exported: InMemorySpanExporter) -> None:
    await declare("traced.parent", partitions=1)
    await declare("traced.child", partitions=1)
    children: list[str] = []

    @app.job("traced.parent")
    async def parent(job: dict[str, int], ctx: JobContext) -> None:
        async with ctx.once():
            children.append(await ctx.enqueue("traced.child", {"of": ctx.job_id}))

    @app.job("traced.child")
    async def child(job: dict[str, str], ctx: JobContext) -> None:
        pass

    async with app.client() as client:
        parent_id_ = await client.enqueue("traced.parent", {"n": 1})
    await app.worker("traced.parent").run(until_idle=True)
    async with OutboxRelay(settings) as relay:
        assert await relay.drain() == 1
    await app.worker("traced.child").run(until_idle=True)

    spans = exported.get_finished_spans()
    enqueue, attempt = of_job(spans, parent_id_)
    sent, ran = of_job(spans, children[0])
    assert (kind_of(sent), kind_of(ran)) == ((PRODUCER, "outbox"), (CONSUMER, "process"))
    assert {trace_id(s) for s in (enqueue, attempt, sent, ran)} == {trace_id(enqueue)}
    assert parent_id(sent) == span_id(attempt)  # enqueued inside the parent's attempt
    assert parent_id(ran) == span_id(sent)


async def test_outbox_firing_and_gateway_enqueues_make_send_spans(
        app: App, declare: Declare, settings: Settings,
        exported: InMemorySpanExporter) -> None:
    await declare("traced.in", partitions=1)
    await declare("traced.tick", partitions=1)

    @app.periodic("traced.tick", name="beat", every="1s")
    async def beat(fire_time: datetime) -> dict[str, int]:
        return {"n": 1}

    conn = await connect(settings)
    try:
        async with app.client() as client, conn.transaction():
            in_transaction = await client.enqueue("traced.in", {"n": 1}, conn=conn)
    finally:
        await conn.close()
    async with OutboxRelay(settings) as relay:
        await relay.drain()
    scheduler = app.scheduler("traced.tick")
    assert scheduler is not None
    async with _running(scheduler):
        await until(lambda: scheduler.fired >= 1, "a firing", within_s=30)
    gateway = create_app(_gateway_settings(settings))
    async with served(gateway) as http:
        answer = await http.post("/jobs/traced.in", json={"payload": {"n": 2}}, headers=AUTH)
        assert answer.status_code == 202, answer.text
        from_gateway = answer.json()["job_ids"][0]

    spans = exported.get_finished_spans()
    assert [kind_of(s) for s in of_job(spans, in_transaction)] == [(PRODUCER, "outbox")]
    assert [kind_of(s) for s in of_job(spans, from_gateway)] == [(PRODUCER, "enqueue")]
    fired = [s for s in spans if _attributes(s).get("stream_jobs.job.type") == "traced.tick"]
    assert fired
    assert all(kind_of(s) == (PRODUCER, "enqueue") for s in fired)
    # Each record carries its send span's context: the next reader continues it.
    records = await read_topic(settings, lane_topic(settings.topic_prefix, "traced.in"))
    carried = {dict(r.headers)[HEADER_TRACEPARENT].decode()[:52] for r in records}
    assert {f"00-{trace_id(s):032x}-{span_id(s):016x}"
            for s in of_job(spans, in_transaction) + of_job(spans, from_gateway)} == carried


@asynccontextmanager
async def _running(scheduler: Scheduler) -> AsyncIterator[None]:
    """`scheduler` run as a task, stopped on exit."""
    task = asyncio.create_task(scheduler.run())
    try:
        yield
    finally:
        scheduler.request_stop()
        await asyncio.wait_for(task, 30)


async def test_a_requeue_and_a_replay_continue_the_trace_with_a_link(
        app: App, declare: Declare, settings: Settings,
        exported: InMemorySpanExporter) -> None:
    await declare("traced.dead", partitions=1, retry_tiers=["1s"], max_attempts=1)
    runs: list[int] = []

    @app.job("traced.dead")
    async def dies_once(job: dict[str, int], ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise PermanentError("first run fails for good")

    async with app.client() as client:
        job_id = await client.enqueue("traced.dead", {"n": 1})
    await app.worker("traced.dead").run(until_idle=True)
    result = await requeue(settings, "traced.dead", select=SelectAll())
    assert result.requeued == 1
    await app.worker("traced.dead").run(until_idle=True)
    lane = lane_topic(settings.topic_prefix, "traced.dead")
    replayed = await replay(settings, lane, partition=0, from_offset=0, to_offset=0)
    assert replayed.written == 1
    await app.worker("traced.dead").run(until_idle=True)

    spans = of_job(exported.get_finished_spans(), job_id)
    assert [kind_of(s) for s in spans] == [
        (PRODUCER, "enqueue"), (CONSUMER, "process"), (PRODUCER, "dead-letter"),
        (PRODUCER, "requeue"), (CONSUMER, "process"), (PRODUCER, "replay"),
        (CONSUMER, "process")]
    _, first, letter, requeued, second, replayed_span, third = spans
    assert len({trace_id(s) for s in spans}) == 1
    assert (parent_id(letter), linked_to(letter)) == (span_id(first), [span_id(first)])
    # The requeue continues from the letter and links to the attempt that died; the replay
    # continues from the record it read again (an enqueued one: no attempt before it).
    assert (parent_id(requeued), linked_to(requeued)) == (span_id(letter), [span_id(first)])
    assert parent_id(second) == span_id(requeued)
    enqueue = spans[0]
    assert parent_id(replayed_span) == span_id(enqueue)  # offset 0: the enqueued record
    assert linked_to(replayed_span) == [span_id(enqueue)]
    assert parent_id(third) == span_id(replayed_span)
    assert _attributes(first)["stream_jobs.job.outcome"] == "dead_lettered"
    assert dlq_topic(settings.topic_prefix, "traced.dead") in letter.name


async def test_without_an_sdk_nothing_is_recorded_nor_added_to_records(
        app: App, declare: Declare, settings: Settings, untraced: None) -> None:
    await declare("traced.off", partitions=1, retry_tiers=["1s"], max_attempts=2)

    @app.job("traced.off")
    async def fails_once(job: dict[str, int], ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("once")

    assert job_spans() is None
    async with app.client() as client:
        await client.enqueue("traced.off", {"n": 1})
    worker = app.worker("traced.off")
    assert worker.spans is None
    await worker.run(until_idle=True)
    assert worker.outcomes["succeeded"] == 1
    records = await read_topic(settings, lane_topic(settings.topic_prefix, "traced.off"))
    assert len(records) == 2  # enqueued, and released from the tier
    assert all(HEADER_TRACEPARENT not in dict(r.headers) for r in records)



async def test_the_trace_id_shows_in_the_log_lines_the_job_command_and_the_job_page(
        app: App, declare: Declare, settings: Settings, exported: InMemorySpanExporter,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stream_jobs")
    await declare("traced.shown", partitions=1, retry_tiers=["1s"], max_attempts=2)

    @app.job("traced.shown")
    async def fails_once(job: dict[str, int], ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("once")
        async with ctx.once():  # a dedup row: the job is `done`
            pass

    async with app.client() as client:
        job_id = await client.enqueue("traced.shown", {"n": 1})
    await app.worker("traced.shown").run(until_idle=True)
    trace = f"{trace_id(of_job(exported.get_finished_spans(), job_id)[0]):032x}"

    # The worker's lines about the job: the failed attempt's and the retry's.
    about = [logs.fields(r) for r in caplog.records
             if r.name == "stream_jobs.worker" and job_id in r.getMessage()]
    assert len(about) == 2
    assert {line["trace_id"] for line in about} == {trace}
    assert any(f"trace_id={trace}" in logs.TextFormatter().format(r) for r in caplog.records)
    # `stream-jobs job ID`, as text and as JSON.
    shown, document = await asyncio.gather(_cli(settings, "job", job_id),
                                           cli_job(settings, job_id))
    assert shown[0] == 0, shown[2]
    assert f"trace {trace}" in shown[1]
    assert (document["status"], document["trace_id"]) == ("done", trace)
    # The dashboard's job page.
    gateway = create_app(_gateway_settings(settings))
    async with served(gateway) as http:
        signed_in = await http.post("/login", data={"token": TOKEN, "next": "/"})
        assert signed_in.status_code == 303
        page = await http.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    assert f'data-figure="trace">{trace}<' in page.text
