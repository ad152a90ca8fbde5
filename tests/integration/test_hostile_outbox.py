"""Outbox rows another program wrote straight into `stream_jobs_outbox`, on the real stack
(issue 28): headers that are not pairs, ten thousand headers, a value that is not JSON, a
row too large for Kafka, rows for topics that do not exist. Each row reaches its type's
DLQ with a reason, or waits in the table with one (`stream-jobs outbox status`); the jobs
committed before and after it are sent and run either way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.naming import dlq_topic, lane_topic
from stream_jobs.outbox.depth import failing_rows
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.outbox.rows import HEADER_UNREADABLE
from stream_jobs.record import HEADER_ERROR
from stream_jobs.settings import Settings
from tests.integration.conftest import Declare
from tests.integration.database import connect, fetch_value
from tests.integration.topic_reader import read_topic


def _reasons(letters: list[Any]) -> dict[str, str]:
    """Each dead letter's job ID (or, for a record without one, its payload) and reason."""
    found = {}
    for letter in letters:
        headers = dict(letter.headers)
        error = orjson.loads(headers[HEADER_ERROR])
        found[letter.value.decode(errors="replace")] = f"{error['reason']}: {error['message']}"
    return found


# -- the outbox: rows another program wrote ----------------------------------------------


async def test_outbox_rows_another_program_wrote_are_dead_lettered_and_the_rest_run(
        app: App, declare: Declare, settings: Settings) -> None:
    job_type = "hostile.outbox"
    await declare(job_type, partitions=1, retry_tiers=["1s"], max_attempts=1)
    ran: list[int] = []

    @app.job(job_type)
    async def note(job: dict[str, int], ctx: JobContext) -> None:
        ran.append(job["n"])

    topic = lane_topic(settings.topic_prefix, job_type)
    ours = [("sj-job-id", "from-elsewhere"), ("sj-type", job_type)]
    conn = await connect(settings)
    try:
        async with conn.transaction():
            await app.client().enqueue(job_type, {"n": 1}, conn=conn)
        # Another program's rows, straight into the table: the headers column as an
        # object, as pairs of numbers, nested; ten thousand headers; a value that is not
        # JSON under good headers.
        hostile = [("{}", b'"object"'), ("[[1, 2]]", b'"numbers"'),
                   ('[[["sj-job-id", "x"]]]', b'"nested"'),
                   (orjson.dumps([*ours, *[["x-junk", "y"]] * 10_000]).decode(), b'{"n": 2}'),
                   (orjson.dumps(ours).decode(), b"not json")]
        for headers, value in hostile:
            await conn.execute("INSERT INTO stream_jobs_outbox (topic, key, value, headers) "
                               "VALUES ($1, NULL, $2, $3::jsonb)", topic, value, headers)
        async with conn.transaction():
            await app.client().enqueue(job_type, {"n": 3}, conn=conn)
    finally:
        await conn.close()

    async with OutboxRelay(settings) as relay:
        moved = await asyncio.wait_for(relay.drain(), 60)
    assert moved == 7
    assert await fetch_value(settings, "SELECT count(*) FROM stream_jobs_outbox") == 0
    worker = app.worker(job_type)
    await worker.run(until_idle=True)

    assert ran == [1, 2, 3]  # before, the ten thousand headers' job, after
    assert worker.outcomes == {"succeeded": 3, "dead_lettered": 4}
    letters = await read_topic(settings, dlq_topic(settings.topic_prefix, job_type))
    reasons = _reasons(letters)
    for shown in ('"object"', '"numbers"', '"nested"'):
        assert reasons[shown].startswith("missing-header: The record has no 'sj-job-id'")
    assert reasons["not json"].startswith("bad-json: the value is not JSON")
    causes = {dict(letter.headers).get(HEADER_UNREADABLE) for letter in letters}
    assert b"The outbox row's headers are a JSON dict, not a list of [name, value] pairs." \
        in causes


async def test_an_outbox_row_kafka_cannot_take_holds_up_no_other_row(
        app: App, declare: Declare, settings: Settings) -> None:
    # It used to fail its topic's send_many every round: the rows beside it were never
    # deleted (the one before it was sent again each round), the one after it never sent.
    job_type = "hostile.bigrow"
    await declare(job_type, partitions=1, retry_tiers=["1s"], max_attempts=1)
    ran: list[int] = []

    @app.job(job_type)
    async def note(job: dict[str, int], ctx: JobContext) -> None:
        ran.append(job["n"])

    topic = lane_topic(settings.topic_prefix, job_type)
    insert = ("INSERT INTO stream_jobs_outbox (topic, key, value, headers) "
              "VALUES ($1, 'b', $2, $3::jsonb)")
    conn = await connect(settings)
    try:
        async with conn.transaction():
            await app.client().enqueue(job_type, {"n": 1}, conn=conn, key="a")
        big = b'{"n": "' + b"x" * (settings.max_payload_bytes * 3) + b'"}'
        for job_id, value in (("huge", big), ("behind-huge", b'{"n": 4}')):
            await conn.execute(insert, topic, value, orjson.dumps(
                [["sj-job-id", job_id], ["sj-type", job_type]]).decode())
        async with conn.transaction():
            await app.client().enqueue(job_type, {"n": 3}, conn=conn, key="c")
    finally:
        await conn.close()

    async with OutboxRelay(settings) as relay:
        assert await asyncio.wait_for(relay.drain(), 60) == 2
    worker = app.worker(job_type)
    await worker.run(until_idle=True)
    assert ran == [1, 3]  # once each
    assert worker.outcomes == {"succeeded": 2}
    # The big row and the one of its key after it wait, each with its reason, for an
    # operator (`stream-jobs outbox status` lists them).
    waiting = await failing_rows(settings)
    assert [(row.job_id, row.attempts) for row in waiting] == [("huge", 1), ("behind-huge", 1)]
    assert waiting[0].last_error is not None
    assert "bytes as a record, over the" in waiting[0].last_error
    assert waiting[0].last_error.endswith("it is never sent; delete it, or raise the limit.")
    assert waiting[1].last_error == (f"It waits behind outbox row {waiting[0].id} of its "
                                     "topic and key, which Kafka cannot take.")


async def test_outbox_rows_for_topics_that_do_not_exist_wait_with_the_reason(
        app: App, declare: Declare, settings: Settings) -> None:
    job_type = "hostile.notopic"
    await declare(job_type, partitions=1)
    ran: list[int] = []

    @app.job(job_type)
    async def note(job: dict[str, int], ctx: JobContext) -> None:
        ran.append(job["n"])

    nowhere = [f"{settings.topic_prefix}.no.such.topic", "", "bad topic name!"]
    headers = orjson.dumps([["sj-job-id", "nowhere"], ["sj-type", job_type]]).decode()
    conn = await connect(settings)
    try:
        for topic in nowhere:
            await conn.execute("INSERT INTO stream_jobs_outbox (topic, key, value, headers) "
                               "VALUES ($1, NULL, $2, $3::jsonb)", topic, b"{}", headers)
        async with conn.transaction():
            await app.client().enqueue(job_type, {"n": 1}, conn=conn)
    finally:
        await conn.close()
    async with OutboxRelay(settings) as relay:
        done = await asyncio.wait_for(relay.relay_once(), 60)
    assert (done.claimed, done.sent, done.failed) == (4, 1, 3)
    worker = app.worker(job_type)
    await worker.run(until_idle=True)
    assert ran == [1]
    waiting = await failing_rows(settings)
    assert [(row.topic, row.attempts) for row in waiting] == [(t, 1) for t in nowhere]
    assert all(row.last_error == f"Topic {row.topic} does not exist: declare its type in "
               "topics/ and run `stream-jobs topics apply`." for row in waiting)
