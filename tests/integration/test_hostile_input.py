"""Hostile records through a real worker: payloads never reach our logs or error headers.

Every payload carries a canary. Each record fails a different way (a handler error, bad
JSON, a payload that does not fit its model, an oversized value, a garbled header); each
must land in the DLQ with its bytes unchanged, while the canary appears in no log record
of ours (at any level) or of anyone's at INFO and above, and in no dead letter's
`sj-error` header (message and traceback).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ConfigDict

from stream_jobs import logs
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.job_ids import new_job_id
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.logs import JsonFormatter, TextFormatter
from stream_jobs.naming import dlq_topic, lane_topic
from stream_jobs.record import HEADER_ATTEMPT, HEADER_ERROR, JobRecord
from stream_jobs.settings import Settings

from .conftest import Declare
from .topic_reader import read_topic

JOB_TYPE = "mail.canary"
CANARY = f"canary-payload-{uuid.uuid4().hex}"


class Mail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str
    body: str


def _record(value: bytes) -> JobRecord:
    job_id = new_job_id()
    return JobRecord(job_id=job_id, job_type=JOB_TYPE, payload=value, key=job_id.encode(),
                     enqueued_at_ms=int(time.time() * 1000))


async def test_payloads_never_reach_logs_or_error_headers(
    settings: Settings, declare: Declare, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="stream_jobs")
    await declare(JOB_TYPE, partitions=1, retry_tiers=["1s"], max_attempts=1,
                  max_payload_bytes=4096)
    app = App(settings)

    @app.job(JOB_TYPE, concurrency=4)
    async def send(job: Mail, ctx: JobContext) -> None:
        raise RuntimeError("the mail server said no")  # what a handler says, not the payload

    secret = {"to": "a@b.c", "body": f"password reset link {CANARY}"}
    cases: dict[str, tuple[bytes, list[tuple[str, bytes]] | None]] = {
        "max-attempts": (orjson.dumps(secret), None),
        "bad-json": (b'{"to": "a@b.c", "body": "' + CANARY.encode() + b'", ', None),
        "invalid-payload": (orjson.dumps({"to": [CANARY], "body": CANARY}), None),
        "too-large": (orjson.dumps({"to": "a", "body": CANARY * 200}), None),
        "bad-header": (orjson.dumps(secret), [(HEADER_ATTEMPT, CANARY.encode())]),
    }
    extra = orjson.dumps({"to": "a", "body": "b", "note": CANARY})  # extra="forbid"
    lane = lane_topic(settings.topic_prefix, JOB_TYPE)
    sent: dict[str, bytes] = {}
    async with JobProducer(settings) as producer:
        for value, more_headers in [*cases.values(), (extra, None)]:
            record = _record(value)
            headers = [*record.headers(), *(more_headers or [])]
            await producer.send_raw(lane, record.key, value, headers)
            sent[record.job_id] = value

    worker = app.worker(JOB_TYPE)
    await worker.run(until_idle=True)

    letters = await read_topic(settings, dlq_topic(settings.topic_prefix, JOB_TYPE))
    assert len(letters) == len(sent)
    reasons: list[str] = []
    for letter in letters:
        headers: dict[str, Any] = dict(letter.headers)
        job_id = headers["sj-job-id"].decode()
        assert letter.value == sent[job_id]  # the evidence is kept byte for byte
        error = headers[HEADER_ERROR]
        assert CANARY.encode() not in error, error
        reasons.append(orjson.loads(error)["reason"])
    assert sorted(reasons) == sorted([*cases, "invalid-payload"])
    assert worker.outcomes["dead_lettered"] == len(sent)

    # Ours at every level, anyone's from INFO up. aiokafka's DEBUG log prints each record
    # it sends, payload included: a driver setting to keep off (see docs/security.md).
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records
                       if r.name.startswith("stream_jobs") or r.levelno >= logging.INFO)
    assert CANARY not in logged
    assert any(r.name.startswith("stream_jobs.worker") for r in caplog.records)
    # The lines as the worker command writes them, text and JSON, fields included.
    ours = [r for r in caplog.records if r.name.startswith("stream_jobs")]
    for formatter in (JsonFormatter(), TextFormatter()):
        written = "\n".join(formatter.format(r) for r in ours)
        assert CANARY not in written
    # Every dead letter has a searchable line: its job (or its record) and where it was.
    dead = [logs.fields(r) for r in ours if "dead-lettered" in r.getMessage()]
    assert len(dead) == len(sent)
    for line in dead:
        assert {"topic", "partition", "offset", "reason"} <= line.keys(), line
        if line["reason"] not in ("too-large", "bad-header"):  # not decoded: no job fields
            assert line["job_id"] in sent
            assert (line["job_type"], line["attempt"]) == (JOB_TYPE, 1)


async def _send_raw(settings: Settings, job_type: str, *job_ids: str) -> None:
    """Records with these IDs, as another producer (bypassing the client's checks) sends."""
    async with JobProducer(settings) as producer:
        for job_id in job_ids:
            record = JobRecord(job_id=job_id, job_type=job_type, payload=b'{"to": "a@b.c"}',
                               key=b"k", enqueued_at_ms=int(time.time() * 1000))
            await producer.send_raw(lane_topic(settings.topic_prefix, job_type), record.key,
                                    record.payload, record.headers())


@pytest.mark.parametrize("length", [65, 100, 256])
async def test_a_job_id_the_dedup_table_cannot_hold_is_dead_lettered_at_once(
    settings: Settings, declare: Declare, app: App, length: int,
) -> None:
    # Another producer's record may carry any ID; the dedup column holds 64 characters. A
    # longer one used to decode, fail ctx.once() on every attempt, and reach the DLQ only
    # as max-attempts, after the tiers.
    job_type = "mail.long-id"
    await declare(job_type, partitions=1, retry_tiers=["1s"], max_attempts=3)
    ran: list[str] = []

    @app.job(job_type)
    async def send(job: dict[str, str], ctx: JobContext) -> None:
        ran.append(ctx.job_id)
        async with ctx.once():
            pass

    long_id = "x" * length
    await _send_raw(settings, job_type, long_id)

    worker = app.worker(job_type)
    await worker.run(until_idle=True)

    assert ran == []  # no attempt ran
    assert worker.outcomes == {"dead_lettered": 1}
    [letter] = await read_topic(settings, dlq_topic(settings.topic_prefix, job_type))
    error = orjson.loads(dict(letter.headers)[HEADER_ERROR])
    assert error["reason"] == "bad-header"
    assert "64" in error["message"]
    assert dict(letter.headers)["sj-job-id"] == long_id.encode()  # the letter is the record


async def test_a_job_id_with_a_control_character_is_dead_lettered_and_a_slash_runs(
    settings: Settings, declare: Declare, app: App, caplog: pytest.LogCaptureFixture,
) -> None:
    # Our client refuses both at enqueue; another producer's record reaches the worker. A
    # control character would forge log lines ("abc\nCRITICAL forged"): bad-header. A '/'
    # only keeps the gateway's routes from naming the job: it runs.
    caplog.set_level(logging.INFO)
    job_type = "mail.forged-id"
    await declare(job_type, partitions=1, retry_tiers=["1s"], max_attempts=1)
    ran: list[str] = []

    @app.job(job_type)
    async def send(job: dict[str, str], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    forged, slashed = "abc\nCRITICAL forged", "orders/42"
    await _send_raw(settings, job_type, forged, slashed)

    worker = app.worker(job_type)
    await worker.run(until_idle=True)

    assert ran == [slashed]
    assert worker.outcomes == {"dead_lettered": 1, "succeeded": 1}
    [letter] = await read_topic(settings, dlq_topic(settings.topic_prefix, job_type))
    assert dict(letter.headers)["sj-job-id"] == forged.encode()  # the letter is the record
    error = orjson.loads(dict(letter.headers)[HEADER_ERROR])
    assert error["reason"] == "bad-header"
    assert "U+000A" in error["message"]
    written = "\n".join(TextFormatter().format(r) for r in caplog.records)
    assert not any(line.startswith("CRITICAL") for line in written.splitlines())
