"""Hostile input where the surfaces of issue 28 meet the outside, on the real stack (outbox
rows another program wrote are in test_hostile_outbox.py): records from another producer
with garbage key and workflow headers, a chain step's result over the limit, the gateway's
enqueue with hostile fields, and cancels of IDs that never existed (gateway and CLI).

Each shows a clear error to whoever sent it (an HTTP 4xx or an exit code 1 with a
sentence, or, for a record from elsewhere, a dead letter with its reason), and that the
jobs accepted before and after the bad one are still processed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from pydantic import SecretStr

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.gateway import create_app
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.naming import dlq_topic, lane_topic
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.record import (
    HEADER_JOB_ID,
    HEADER_TYPE,
    HEADER_UNIQUE,
    HEADER_WORKFLOW,
)
from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env
from tests.integration.conftest import Declare
from tests.integration.database import fetch_value
from tests.integration.topic_reader import read_topic

from .test_hostile_outbox import _reasons

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))
TOKEN = "hostile-surfaces-token-5c1e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# -- records from another producer: key and workflow headers ---------------------------------


async def _send_raw(settings: Settings, job_type: str,
                    records: list[tuple[str, list[tuple[str, bytes]]]]) -> None:
    """Records as another producer writes them: (job ID, extra headers) each."""
    async with JobProducer(settings) as producer:
        for job_id, extra in records:
            headers = [(HEADER_JOB_ID, job_id.encode()), (HEADER_TYPE, job_type.encode()),
                       *extra]
            await producer.send_raw(lane_topic(settings.topic_prefix, job_type),
                                    job_id.encode(), orjson.dumps({"id": job_id}), headers)


async def test_garbage_key_and_workflow_headers_are_dead_lettered_and_the_rest_run(
        app: App, declare: Declare, settings: Settings) -> None:
    # A NUL in sj-unique or sj-workflow used to decode: the job ran, then giving its key
    # back (or counting it in its batch) failed in Postgres on every try, so the worker
    # never finished it and never committed past it.
    job_type = "hostile.headers"
    await declare(job_type, partitions=1, retry_tiers=["1s"], max_attempts=1)
    ran: list[str] = []

    @app.job(job_type)
    async def note(job: dict[str, str], ctx: JobContext) -> None:
        async with ctx.once():
            ran.append(job["id"])

    async with app.client() as client:
        before = await client.enqueue(job_type, {"id": "before"}, job_id="before",
                                      unique_key="k-before")
    await _send_raw(settings, job_type, [
        ("nul-unique", [(HEADER_UNIQUE, b"k\x00")]),
        ("nul-batch", [(HEADER_WORKFLOW, b"batch:\x00")]),
        ("long-debounce", [("sj-debounce", b"d" * 300)]),
        ("forged-line", [(HEADER_UNIQUE, b"k\nCRITICAL forged")]),
        ("utf8-not", [(HEADER_WORKFLOW, b"batch:\xff")]),
        # Garbled or unknown, yet harmless: the job runs as a job of its own.
        ("no-such-chain", [(HEADER_WORKFLOW, b"chain:3:never-existed")]),
        ("garbled", [(HEADER_WORKFLOW, b"batch")]),
    ])
    async with app.client() as client:
        after = await client.enqueue(job_type, {"id": "after"}, job_id="after",
                                     unique_key="k-after")
    async with OutboxRelay(settings) as relay:  # a unique job goes through the outbox
        assert await relay.drain() == 2
    worker = app.worker(job_type)
    await asyncio.wait_for(worker.run(until_idle=True), 60)

    assert sorted(ran) == ["after", "before", "garbled", "no-such-chain"]
    assert worker.outcomes == {"succeeded": 4, "dead_lettered": 5}
    reasons = _reasons(await read_topic(settings, dlq_topic(settings.topic_prefix, job_type)))
    assert reasons == {
        '{"id":"nul-unique"}': "bad-header: The 'sj-unique' header holds the control "
                               "character U+0000.",
        '{"id":"nul-batch"}': "bad-header: The 'sj-workflow' header holds the control "
                              "character U+0000.",
        '{"id":"long-debounce"}': "bad-header: The 'sj-debounce' header is 300 characters, "
                                  "over the limit of 255.",
        '{"id":"forged-line"}': "bad-header: The 'sj-unique' header holds the control "
                                "character U+000A.",
        '{"id":"utf8-not"}': "bad-header: The 'sj-workflow' header is not UTF-8 text.",
    }
    # The keys of the jobs before and after were given back.
    assert await fetch_value(settings, "SELECT count(*) FROM stream_jobs_unique WHERE "
                             "finished_at IS NULL") == 0
    assert (before, after) == ("before", "after")


# -- the gateway's enqueue and cancel; the CLI's cancel ------------------------------------


async def _served(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    gateway = create_app(settings.model_copy(update={"gateway_token": SecretStr(TOKEN)}),
                         sample=False)
    async with gateway.router.lifespan_context(gateway), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gateway), base_url="http://localhost",
            headers=AUTH) as http:
        yield http


@pytest.fixture
async def http(app: App, declare: Declare) -> AsyncIterator[httpx.AsyncClient]:
    await declare("hostile.gateway", partitions=1, retry_tiers=["1s"], max_attempts=1)
    async for client in _served(app.settings):
        yield client


HOSTILE_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"tenant": "t" * 129}, "A tenant is at most 128 bytes of UTF-8; this one is 129."),
    ({"tenant": "é" * 65}, "A tenant is at most 128 bytes of UTF-8; this one is 130."),
    ({"tenant": "acme\x00"}, "A tenant cannot contain the control character U+0000"),
    ({"tenant": ""}, "A tenant cannot be empty"),
    # The body is strict JSON: an escaped lone surrogate never reaches the fields' checks.
    ({"tenant": "\ud800"}, "The body is not strict JSON: no low surrogate in string."),
    ({"key": "k\udfff"}, "The body is not strict JSON: "),
    ({"key": "k" * 10_000}, "String should have at most 1024 characters"),
    ({"key": "k\nCRITICAL forged"}, "A key cannot contain the control character U+000A"),
    ({"unique_key": "digest:user-42"}, "Extra inputs are not permitted"),
    ({"debounce": "30s"}, "Extra inputs are not permitted"),
]


async def test_the_gateway_refuses_hostile_job_fields_with_a_sentence(
        app: App, http: httpx.AsyncClient) -> None:
    # A body that was not JSON used to be answered "JSON decode error" alone.
    job_type = "hostile.gateway"
    ran: list[int] = []

    @app.job(job_type)
    async def note(job: dict[str, int], ctx: JobContext) -> None:
        ran.append(job["n"])

    before = await http.post(f"/jobs/{job_type}", json={"payload": {"n": 1}, "tenant": "acme"})
    assert before.status_code == 202, before.text
    for fields, said in HOSTILE_FIELDS:
        answer = await http.post(f"/jobs/{job_type}",
                                 content=_json_with_escapes({"payload": {"n": 0}, **fields}),
                                 headers={"Content-Type": "application/json"})
        assert answer.status_code == 422, (fields, answer.text)
        # One problem per shape the body could have had (a job, a batch): one names it.
        problems = [problem["msg"] for problem in answer.json()["detail"]]
        assert any(said in problem for problem in problems), (fields, problems)
    # Bytes that are not UTF-8 at all, and a body nested past any parser's depth.
    for raw in (b'{"payload": {"n": 0}, "key": "\xff\xfe"}',
                b'{"payload": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001):
        answer = await http.post(f"/jobs/{job_type}", content=raw,
                                 headers={"Content-Type": "application/json"})
        assert answer.status_code == 422, answer.text[:300]
        assert answer.json()["detail"][0]["msg"].startswith("The body is not strict JSON: ")
        assert len(answer.text) < 300, answer.text  # what was wrong, not the body again
    after = await http.post(f"/jobs/{job_type}", json={"payload": {"n": 2}})
    assert after.status_code == 202, after.text

    worker = app.worker(job_type)
    await worker.run(until_idle=True)
    assert ran == [1, 2]  # nothing refused was written, nothing accepted lost
    assert worker.outcomes == {"succeeded": 2}


def _json_with_escapes(value: dict[str, Any]) -> bytes:
    """JSON with anything but ASCII escaped, lone surrogates too ("\\ud800"), as a client
    in another language may send them (orjson refuses to write those)."""
    return json.dumps(value).encode()


NEVER_IDS = ["0190a2b4-0000-7000-8000-000000000000", "x" * 64, "é€"]  # looked for, not found
IMPOSSIBLE_IDS = {"": "A job ID is 1 to 64 characters.", "x" * 100_000: "A job ID is 1 to 64",
                  "a\nCRITICAL forged": "cannot contain the control character U+000A",
                  "\udcff\udcfe": "must be valid UTF-8 text"}  # bytes 0xff 0xfe on argv


async def _cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, *(arg.encode(errors="surrogateescape") for arg in args), cwd=ROOT,
        env=settings_env(settings, COLUMNS="200"), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cancels_of_ids_that_never_existed_are_refused_with_a_sentence(
        app: App, http: httpx.AsyncClient) -> None:
    # An impossible ID used to be looked for everywhere, then quoted back whole: a 100 KB
    # error, a forged second line on the terminal, or, for bytes that are not UTF-8, four
    # notes that Postgres "failed" (it had refused the text).
    job_type = "hostile.gateway"
    ran: list[int] = []

    @app.job(job_type)
    async def note(job: dict[str, int], ctx: JobContext) -> None:
        ran.append(job["n"])

    async with app.client() as client:
        waiting = await client.enqueue(job_type, {"n": 1})
    for job_id in NEVER_IDS:
        answer = await http.post(f"/jobs/{job_id}/cancel?type={job_type}")
        assert answer.status_code == 404, (job_id, answer.text)
        assert answer.json()["detail"].startswith(f"No job {job_id} was found")
    # Bytes that are not UTF-8 in a URL reach us as U+FFFD: an ID looked for, not found.
    for path, said in [("%0Aforged", "U+000A"), ("%FF%FE", "No job \ufffd\ufffd was found"),
                       ("x" * 65, "at most 64")]:
        answer = await http.post(f"/jobs/{path}/cancel")
        assert answer.status_code in (404, 422), (path, answer.text)
        assert said in answer.text, (path, answer.text)
        assert len(answer.text) < 400
    # A batch no row can hold used to be a 503 "Postgres failed" (with Retry-After).
    answer = await http.get("/batches/a%00b")
    assert answer.status_code == 404, answer.text
    assert answer.json()["detail"].startswith("No batch or chain has the ID given")
    # The CLI: exit code 1 and one line, naming what is wrong without quoting the ID.
    results = await asyncio.gather(*(_cli(app.settings, "cancel", job_type, job_id)
                                     for job_id in IMPOSSIBLE_IDS))
    for (code, out, err), said in zip(results, IMPOSSIBLE_IDS.values(), strict=True):
        assert (code, out) == (1, ""), err
        assert err.startswith("error: No job can have the ID given, so nothing was "
                              "cancelled: "), err
        assert said in err
        assert len(err.strip().splitlines()) == 1
        assert len(err) < 400

    async with app.client() as client:
        after = await client.enqueue(job_type, {"n": 2})
    worker = app.worker(job_type)
    await worker.run(until_idle=True)
    assert ran == [1, 2]  # the job waiting before, and the one enqueued after, both ran
    assert (waiting, after) != ("", "")


async def test_the_cli_refuses_keys_and_tenants_that_are_not_utf8_with_a_sentence(
        app: App, declare: Declare) -> None:
    # A --key of bytes that are not UTF-8 passed the check and ended in a traceback
    # (UnicodeEncodeError) when the record was made.
    job_type = "hostile.cli"
    await declare(job_type, partitions=1)
    cases = {"--key": "A --key must be valid UTF-8 text (it holds a lone surrogate).",
             "--tenant": "A tenant must be valid UTF-8 text (it holds a lone surrogate).",
             "--unique-key": "A unique_key must be valid UTF-8 text (it holds a lone "
                             "surrogate)."}
    results = await asyncio.gather(*(
        _cli(app.settings, "enqueue", job_type, '{"n": 1}', f"{option}=\udcff\udcfe")
        for option in cases))
    for (code, out, err), said in zip(results, cases.values(), strict=True):
        assert (code, out, err) == (1, "", f"error: {said}\n")


# -- a result over the limit, in a chain ------------------------------------------------------


async def test_a_chain_step_whose_result_is_over_the_limit_stops_the_chain_and_says_why(
        app: App, declare: Declare, settings: Settings) -> None:
    # A chain keeps each step's result for the next one, whether or not the type keeps
    # results: one over max_result_bytes fails the step (retried, then dead-lettered),
    # the chain stops there and says why, and the jobs around it run.
    job_type = "hostile.chain"
    await declare(job_type, partitions=1, retry_tiers=["1s"], max_attempts=2)
    app = App(settings.model_copy(update={"max_result_bytes": 1000}))  # on app's schema
    ran: list[int] = []

    @app.job(job_type)
    async def step(job: dict[str, int], ctx: JobContext) -> str:
        ran.append(job["n"])
        return "x" * job["size"]

    async with app.client() as client:
        before = await client.enqueue(job_type, {"n": 0, "size": 10})
        chain_id = await client.chain(*(Job(job_type, {"n": n, "size": size})
                                        for n, size in ((1, 10), (2, 5000), (3, 10))))
        after = await client.enqueue(job_type, {"n": 4, "size": 10})
        outcomes: Counter[str] = Counter()
        # A chain's next step is written to the outbox when a step succeeds: relay, run,
        # until the relay finds nothing more.
        async with OutboxRelay(settings) as relay:
            while await relay.drain() or not outcomes:
                worker = app.worker(job_type)
                await asyncio.wait_for(worker.run(until_idle=True), 60)
                outcomes.update(worker.outcomes)
        progress = await client.progress(chain_id)

    assert sorted(ran) == [0, 1, 2, 2, 4]  # step 2 twice (max_attempts), step 3 never
    assert outcomes == {"succeeded": 3, "retried": 1, "dead_lettered": 1}
    assert progress.state == "failed"
    assert progress.failed_step == 1
    assert "ResultTooLarge: The hostile.chain result is 5,002 bytes as JSON, over the limit " \
           "of 1,000" in (progress.failure or "")
    assert (before, after) != ("", "")
