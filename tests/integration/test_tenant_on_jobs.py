"""A tenant on every job, on the real broker and Postgres: given through the client, a
batch, the outbox (`conn=`), the gateway and the CLI, each arrives as `ctx.tenant`; the
lookup, `stream-jobs job` and the gateway show it, every span of the job carries it, a
child job takes its parent's; a bad `sj-tenant` from another
producer is dead-lettered as bad-header without running, and `dlq requeue` sends it back
without the bad header (a good one is kept).

The pure halves (each refusal's sentence, the round trip, the letter) are in
tests/unit/test_tenant_on_jobs.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
from fastapi import FastAPI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.gateway import create_app
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.naming import dlq_topic, lane_topic
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.outbox.rows import child_job_id
from stream_jobs.record import HEADER_ERROR, HEADER_TENANT, JobRecord
from stream_jobs.settings import Settings
from stream_jobs.tenants import MAX_TENANT_BYTES, tenant_problem
from tests.traced import kind_of, of_job

from .cli_env import settings_env
from .conftest import Declare
from .database import connect
from .topic_reader import read_topic

CLI = str(Path(sys.executable).with_name("stream-jobs"))
TOKEN = "tenant-gw-token-7e2a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BAD_HEADERS = {"long": b"t" * (MAX_TENANT_BYTES + 1), "not-utf8": b"\xff",
               "control": b"acme\nCRITICAL forged"}


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def _cli(settings: Settings, *args: str) -> Ran:
    """`stream-jobs ARGS` as an operator runs it, on this test's topics and schema."""
    proc = await asyncio.create_subprocess_exec(CLI, *args, env=settings_env(settings),
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


@asynccontextmanager
async def _served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:
        yield http


def _gateway(settings: Settings) -> FastAPI:
    return create_app(settings.model_copy(update={"gateway_token": SecretStr(TOKEN)}))


async def test_a_tenant_travels_from_every_enqueue_path_to_ctx_tenant(
        settings: Settings, app: App, declare: Declare) -> None:
    job_type = "tenant.paths"
    await declare(job_type, partitions=2, retry_tiers=["1s"], max_attempts=1)
    seen: dict[str, str | None] = {}

    @app.job(job_type)
    async def handle(job: dict[str, str], ctx: JobContext) -> None:
        seen[job["via"]] = ctx.tenant

    ids: dict[str, str] = {}
    async with app.client() as client:
        ids["direct"] = await client.enqueue(job_type, {"via": "direct"}, tenant="acme")
        ids["none"] = await client.enqueue(job_type, {"via": "none"})
        ids["many"], ids["many-none"] = await client.enqueue_many([
            Job(job_type, {"via": "many"}, tenant="globex"), Job(job_type, {"via": "many-none"})])
        ids["unique"] = await client.enqueue(job_type, {"via": "unique"}, tenant="hooli",
                                             unique_key="u-1")
        conn = await connect(settings)
        try:
            async with conn.transaction():
                ids["outbox"] = await client.enqueue(job_type, {"via": "outbox"}, conn=conn,
                                                     tenant="initech")
        finally:
            await conn.close()
    async with _served(_gateway(settings)) as http:
        answer = await http.post(f"/jobs/{job_type}", headers=AUTH, json={"jobs": [
            {"payload": {"via": "gateway"}, "tenant": "umbrella"},
            {"payload": {"via": "gateway-none"}}]})
        assert answer.status_code == 202, answer.text
        ids["gateway"], ids["gateway-none"] = answer.json()["job_ids"]
    sent = await _cli(settings, "enqueue", job_type, '{"via": "cli"}', "--tenant", "été-42")
    assert sent.returncode == 0, sent.stderr
    ids["cli"] = sent.stdout.strip()

    async with OutboxRelay(settings) as relay:
        await relay.drain()
    worker = app.worker(job_type)
    await worker.run(until_idle=True)
    assert seen == {"direct": "acme", "none": None, "many": "globex", "many-none": None,
                    "unique": "hooli", "outbox": "initech", "gateway": "umbrella",
                    "gateway-none": None, "cli": "été-42"}
    assert worker.outcomes == {"succeeded": len(seen)}

    # Shown where a job is looked at: `stream-jobs job`, its --json, the gateway's lookup.
    shown = await _cli(settings, "job", ids["cli"], "--type", job_type)
    assert shown.returncode == 0, shown.stderr
    assert "tenant été-42" in shown.stdout.splitlines()
    plain = await _cli(settings, "job", ids["none"], "--type", job_type)
    assert not any(line.startswith("tenant") for line in plain.stdout.splitlines())
    as_json = await _cli(settings, "job", ids["outbox"], "--type", job_type, "--json")
    assert orjson.loads(as_json.stdout)["tenant"] == "initech"
    async with _served(_gateway(settings)) as http:
        found = await http.get(f"/jobs/{ids['gateway']}", headers=AUTH,
                               params={"type": job_type})
        assert found.status_code == 200, found.text
        assert found.json()["tenant"] == "umbrella"


async def test_a_bad_tenant_is_refused_at_the_gateway_and_the_cli_with_its_sentence(
        settings: Settings, app: App, declare: Declare) -> None:
    job_type = "tenant.refused"
    await declare(job_type, partitions=1)
    async with _served(_gateway(settings)) as http:
        for tenant in ("", "t" * (MAX_TENANT_BYTES + 1), "a\tb"):
            answer = await http.post(f"/jobs/{job_type}", headers=AUTH,
                                     json={"payload": {}, "tenant": tenant})
            assert answer.status_code == 422, answer.text
            # The body is one job or a batch: the one job's error names the field.
            said = {tuple(e["loc"]): e["msg"] for e in answer.json()["detail"]}
            assert said[("body", "JobIn", "tenant")] == f"Value error, {tenant_problem(tenant)}"
        # A lone surrogate is not JSON text the gateway takes: refused before the model.
        surrogate = await http.post(f"/jobs/{job_type}",
                                    headers={**AUTH, "content-type": "application/json"},
                                    content=b'{"payload": {}, "tenant": "a\\udcff"}')
        assert surrogate.status_code in (400, 422), surrogate.text
    for tenant in ("", "a\x1bb", "t" * (MAX_TENANT_BYTES + 1)):
        refused = await _cli(settings, "enqueue", job_type, "{}", "--tenant", tenant)
        assert refused.returncode == 1, refused.stdout
        assert refused.stderr.strip() == f"error: {tenant_problem(tenant)}"
    assert await read_topic(settings, lane_topic(settings.topic_prefix, job_type)) == []


async def test_a_bad_tenant_header_is_dead_lettered_unrun_and_requeued_without_it(
        settings: Settings, app: App, declare: Declare) -> None:
    job_type = "tenant.raw"
    await declare(job_type, partitions=1, retry_tiers=["1s"], max_attempts=1)
    ran: dict[str, str | None] = {}

    @app.job(job_type)
    async def handle(job: dict[str, str], ctx: JobContext) -> None:
        if job["via"] == "good" and ctx.attempt == 1:
            raise PermanentError("the first run of the good one fails")
        ran[job["via"]] = ctx.tenant

    # Another producer's records: ours but for the header, which no client would write.
    async with JobProducer(settings) as producer:
        for name, raw in BAD_HEADERS.items():
            record = JobRecord(job_id=f"raw-{name}", job_type=job_type,
                               payload=orjson.dumps({"via": name}), key=name.encode(),
                               enqueued_at_ms=int(time.time() * 1000))
            await producer.send_raw(lane_topic(settings.topic_prefix, job_type), record.key,
                                    record.payload, [*record.headers(), (HEADER_TENANT, raw)])
    async with app.client() as client:
        good_id = await client.enqueue(job_type, {"via": "good"}, tenant="acme")

    worker = app.worker(job_type)
    await worker.run(until_idle=True)
    assert ran == {}  # no handler ran for a bad header
    letters = await read_topic(settings, dlq_topic(settings.topic_prefix, job_type))
    reasons = {dict(letter.headers)["sj-job-id"].decode():
               orjson.loads(dict(letter.headers)[HEADER_ERROR])["reason"] for letter in letters}
    assert reasons == {**{f"raw-{name}": "bad-header" for name in BAD_HEADERS},
                       good_id: "permanent"}
    for letter in letters:  # the letter keeps the record as it came
        if dict(letter.headers)["sj-job-id"].startswith(b"raw-"):
            name = dict(letter.headers)["sj-job-id"].decode().removeprefix("raw-")
            assert dict(letter.headers)[HEADER_TENANT] == BAD_HEADERS[name]

    done = await _cli(settings, "dlq", "requeue", job_type, "--all")
    assert done.returncode == 0, done.stderr
    lane = await read_topic(settings, lane_topic(settings.topic_prefix, job_type))
    requeued = {dict(r.headers)["sj-job-id"].decode(): dict(r.headers).get(HEADER_TENANT)
                for r in lane if dict(r.headers).get("sj-requeues") == b"1"}
    assert requeued == {**{f"raw-{name}": None for name in BAD_HEADERS}, good_id: b"acme"}

    again = app.worker(job_type)
    await again.run(until_idle=True)
    assert ran == {**dict.fromkeys(BAD_HEADERS), "good": "acme"}
    assert again.outcomes == {"succeeded": len(BAD_HEADERS) + 1}


async def test_a_child_takes_its_parents_tenant_and_every_span_carries_it(
        settings: Settings, app: App, declare: Declare,
        exported: InMemorySpanExporter) -> None:
    parent_type, child_type = "tenant.parent", "tenant.child"
    await declare(parent_type, partitions=1)
    await declare(child_type, partitions=1)
    seen: dict[str, str | None] = {}

    @app.job(parent_type)
    async def parent(job: dict[str, str], ctx: JobContext) -> None:
        seen["parent"] = ctx.tenant
        async with ctx.once():
            await ctx.enqueue(child_type, {"of": "inherited"}, name="inherited")
            await ctx.enqueue(child_type, {"of": "own"}, name="own", tenant="globex")

    @app.job(child_type)
    def child(job: dict[str, str], ctx: JobContext) -> None:  # a plain `def` reads it alike
        seen[job["of"]] = ctx.tenant

    async with app.client() as client:
        parent_id = await client.enqueue(parent_type, {}, tenant="acme")
    await app.worker(parent_type).run(until_idle=True)
    async with OutboxRelay(settings) as relay:
        await relay.drain()
    await app.worker(child_type).run(until_idle=True)
    assert seen == {"parent": "acme", "inherited": "acme", "own": "globex"}

    spans = exported.get_finished_spans()
    for job_id, tenant in ((parent_id, "acme"), (child_job_id(parent_id, "inherited"), "acme"),
                           (child_job_id(parent_id, "own"), "globex")):
        found = of_job(spans, job_id)
        assert {kind_of(s)[1] for s in found} >= {"process"}, [s.name for s in found]
        assert {(s.attributes or {}).get("stream_jobs.tenant") for s in found} == {tenant}
