"""A tenant on every job (docs/fairness.md): given at enqueue on every path, refused there
in one sentence when it is not one, carried by the record, read as `ctx.tenant` (also by
a child job that names none), and a bad `sj-tenant` from another producer dead-lettered
as bad-header, then dropped by a requeue.

The same paths on the real broker: tests/integration/test_tenant_on_jobs.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from stream_jobs import App, JobContext
from stream_jobs.client import Job, JobClient
from stream_jobs.dlq.letters import read_letter, requeued_record
from stream_jobs.errors import BadRecord, ConfigError
from stream_jobs.failures import FailureInfo
from stream_jobs.gateway.api import JobIn
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.lookup.location import JobLocation, Sighting, sighting_from
from stream_jobs.outbox.rows import child_job_id
from stream_jobs.record import (
    HEADER_JOB_ID,
    HEADER_TENANT,
    HEADER_TYPE,
    JobRecord,
    dead_letter_headers,
    decode_record,
)
from stream_jobs.settings import Settings
from stream_jobs.tenants import MAX_TENANT_BYTES, tenant_problem
from stream_jobs.testing.plugin import StartTester
from stream_jobs.tracing.rules import tenant_of

# Each way a tenant is not one, and the sentence that says so.
BAD: list[tuple[object, str]] = [
    ("a" * (MAX_TENANT_BYTES + 1), "A tenant is at most 128 bytes of UTF-8; this one is 129."),
    ("é" * 65, "A tenant is at most 128 bytes of UTF-8; this one is 130."),
    ("", "A tenant cannot be empty; leave it out for a job of no tenant."),
    ("acme\udcff", "A tenant must be valid UTF-8 text (it holds a lone surrogate)."),
    ("acme\nCRITICAL forged", "A tenant cannot contain the control character U+000A: "
                              "tenants are shown in log lines, pages and terminals."),
    ("a\u2028b", "A tenant cannot contain the control character U+2028: "
                 "tenants are shown in log lines, pages and terminals."),
    (42, "A tenant is text, not int."),
    (b"acme", "A tenant is text, not bytes."),
]
BAD_HEADERS = [b"a" * (MAX_TENANT_BYTES + 1), b"\xff", b"ac\x1bme", b""]
TYPES: dict[str, Any] = {"order.place": {"partitions": 2}, "invoice.render": {"partitions": 2}}


def _client() -> JobClient:
    return JobClient(Settings(), {"t": JobTypePolicy("t")})


@pytest.mark.parametrize(("tenant", "says"), BAD)
def test_the_client_refuses_a_tenant_that_is_not_one_in_one_sentence(tenant: object,
                                                                     says: str) -> None:
    assert tenant_problem(tenant) == says
    with pytest.raises(ConfigError) as refused:
        _client().prepare(Job("t", {}, tenant=tenant))  # type: ignore[arg-type]
    assert str(refused.value) == says


@pytest.mark.parametrize(("tenant", "says"), [(t, s) for t, s in BAD if isinstance(t, str)
                                              and "surrogate" not in s])
def test_the_gateway_refuses_the_same_with_the_same_sentence(tenant: str, says: str) -> None:
    # A lone surrogate never reaches the model: the gateway's strict JSON refuses it first.
    with pytest.raises(ValidationError) as refused:
        JobIn.model_validate({"payload": {}, "tenant": tenant})
    [error] = refused.value.errors()
    assert error["loc"] == ("tenant",)
    assert says in error["msg"]


def test_a_tenant_is_on_the_record_and_none_is_no_header() -> None:
    _, record = _client().prepare(Job("t", {}, tenant="acme"))
    assert record.tenant == "acme"
    assert (HEADER_TENANT, b"acme") in record.headers()
    _, plain = _client().prepare(Job("t", {}))
    assert plain.tenant is None
    assert HEADER_TENANT not in dict(plain.headers())


_TENANTS = st.text(min_size=1, max_size=MAX_TENANT_BYTES).filter(
    lambda text: tenant_problem(text) is None)


@given(_TENANTS)
def test_any_tenant_the_rule_accepts_survives_headers_and_decode(tenant: str) -> None:
    _, record = _client().prepare(Job("t", {}, tenant=tenant))
    decoded = decode_record(key=record.key, value=record.payload, headers=record.headers(),
                            expected_type="t", max_payload_bytes=1 << 20)
    assert decoded.tenant == tenant
    assert decoded == record
    assert JobIn.model_validate({"payload": {}, "tenant": tenant}).tenant == tenant


@pytest.mark.parametrize("raw", BAD_HEADERS)
def test_a_bad_tenant_header_is_bad_header(raw: bytes) -> None:
    headers = [(HEADER_JOB_ID, b"j-1"), (HEADER_TYPE, b"t"), (HEADER_TENANT, raw)]
    with pytest.raises(BadRecord) as caught:
        decode_record(key=None, value=b"{}", headers=headers, expected_type="t",
                      max_payload_bytes=1 << 20)
    assert caught.value.reason == "bad-header"
    assert "'sj-tenant' header" in str(caught.value)


# -- the DLQ: a requeue drops a bad header, keeps a good one ------------------------------


@dataclass
class FakeLetter:
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    key: bytes | None = None
    topic: str = "jobs.t.dlq"
    partition: int = 0
    offset: int = 3
    timestamp: int = 1_700_000_000_000


def _letter_of(tenant_header: bytes, reason: str) -> FakeLetter:
    """The dead letter of a job whose `sj-tenant` is `tenant_header`, as the worker writes it."""
    job = JobRecord(job_id="j-1", job_type="t", payload=b"{}", key=b"k")
    failure = FailureInfo(reason, "BadRecord", "why", "", 1_700_000_000_000)
    headers = dead_letter_headers([*job.headers(), (HEADER_TENANT, tenant_header)],
                                  failure=failure, origin="jobs.t/0/1", job_type="t")
    return FakeLetter(b"{}", headers, b"k")


@pytest.mark.parametrize("raw", BAD_HEADERS)
def test_a_requeue_drops_a_tenant_header_that_names_no_tenant(raw: bytes) -> None:
    letter = read_letter(_letter_of(raw, "bad-header"), "t", 1 << 20)
    assert letter.reason == "bad-header"
    assert letter.job is not None  # runnable: requeue sends it
    assert letter.job.tenant is None
    _, record = requeued_record(letter.job, JobTypePolicy("t"), reset_attempts=False,
                                now_ms=1_700_000_000_000)
    assert HEADER_TENANT not in dict(record.headers())


def test_a_requeue_keeps_a_good_tenant() -> None:
    letter = read_letter(_letter_of(b"acme", "max-attempts"), "t", 1 << 20)
    assert letter.job is not None
    assert letter.job.tenant == "acme"
    _, record = requeued_record(letter.job, JobTypePolicy("t"), reset_attempts=False,
                                now_ms=1_700_000_000_000)
    assert dict(record.headers())[HEADER_TENANT] == b"acme"


def test_the_lookup_shows_the_tenant_a_record_names_and_not_a_bad_one() -> None:
    def seen(raw: bytes) -> Sighting:
        record = FakeLetter(b"{}", [(HEADER_TENANT, raw)])
        return sighting_from(record, {HEADER_TENANT: raw}, role="lane", name="default",
                             committed=None)

    found = JobLocation("j-1", "pending", "t", sightings=(seen(b"acme"), seen(b"\xff")))
    assert found.tenant == "acme"
    assert found.to_dict()["tenant"] == "acme"
    assert tenant_of(found) == "acme"  # what the job's page and spans read
    assert JobLocation("j-2", "pending", "t", sightings=(seen(b"a\nb"),)).tenant is None


# -- ctx.tenant in handlers, on every enqueue path ----------------------------------------


def tenant_app(seen: dict[str, str | None]) -> App:
    app = App()

    @app.job("order.place")
    async def place(order: dict[str, Any], ctx: JobContext) -> None:
        seen[order["id"]] = ctx.tenant
        async with ctx.once():
            await ctx.enqueue("invoice.render", {"id": f"{order['id']}/child"}, name="child")
            await ctx.enqueue("invoice.render", {"id": f"{order['id']}/own"}, name="own",
                              tenant="globex")

    @app.job("invoice.render")
    def render(invoice: dict[str, Any], ctx: JobContext) -> None:  # a sync handler
        seen[invoice["id"]] = ctx.tenant

    return app


async def test_ctx_tenant_is_what_each_enqueue_path_gave(job_tester: StartTester) -> None:
    seen: dict[str, str | None] = {}
    app = tenant_app(seen)
    t = job_tester(app, types=TYPES)
    await t.enqueue("order.place", {"id": "direct"}, tenant="acme")
    await t.enqueue("order.place", {"id": "none"})
    await t.enqueue_many([Job("invoice.render", {"id": "many"}, tenant="initech")])
    await t.enqueue("invoice.render", {"id": "unique"}, tenant="acme", unique_key="u-1")
    await t.enqueue("invoice.render", {"id": "debounced"}, tenant="acme", key="d",
                    debounce="5s")
    async with t.transaction() as conn:
        await t.enqueue("invoice.render", {"id": "outbox"}, conn=conn, tenant="umbrella")
    with app.sync_client() as client:
        client.enqueue("invoice.render", {"id": "sync"}, tenant="hooli")
    with t.transaction() as sync_conn, app.sync_client() as client:
        client.enqueue("invoice.render", {"id": "sync-outbox"}, conn=sync_conn, tenant="stark")
    await t.run_until_idle()
    assert seen == {
        "direct": "acme", "direct/child": "acme", "direct/own": "globex",
        "none": None, "none/child": None, "none/own": "globex",
        "many": "initech", "unique": "acme", "debounced": "acme", "outbox": "umbrella",
        "sync": "hooli", "sync-outbox": "stark"}


async def test_a_bad_tenant_is_refused_on_every_path_before_anything_is_sent(
        job_tester: StartTester) -> None:
    refused: list[str] = []
    app = App()

    @app.job("order.place")
    async def place(order: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once():
            try:
                await ctx.enqueue("invoice.render", {}, tenant="a\tb")
            except ConfigError as exc:
                refused.append(str(exc))

    @app.job("invoice.render")
    async def render(invoice: dict[str, Any], ctx: JobContext) -> None:
        raise AssertionError("no job was to be sent")

    t = job_tester(app, types=TYPES)
    says = tenant_problem("")
    with pytest.raises(ConfigError, match=says):
        await t.enqueue("invoice.render", {}, tenant="")
    with pytest.raises(ConfigError, match=says):
        await t.enqueue("invoice.render", {}, tenant="", unique_key="u")
    with pytest.raises(ConfigError, match=says):
        await t.enqueue_many([Job("invoice.render", {}), Job("invoice.render", {}, tenant="")])
    with pytest.raises(ConfigError, match=says), app.sync_client() as client:
        client.enqueue("invoice.render", {}, tenant="")
    async with t.transaction() as conn:
        with pytest.raises(ConfigError, match=says):
            await t.enqueue("invoice.render", {}, conn=conn, tenant="")
    parent = await t.enqueue("order.place", {})
    await t.run_until_idle()
    assert refused == [tenant_problem("a\tb")]
    assert t.outcomes == {"succeeded": 1}
    assert t.records_of(child_job_id(parent, "0")) == []


async def test_a_bad_tenant_header_from_another_producer_is_dead_lettered_unrun(
        job_tester: StartTester) -> None:
    seen: dict[str, str | None] = {}
    t = job_tester(tenant_app(seen), types=TYPES)
    for n, raw in enumerate(BAD_HEADERS):
        job = JobRecord(job_id=f"raw-{n}", job_type="invoice.render", payload=b'{"id": "x"}',
                        key=b"k")
        t.send_raw("invoice.render", job.payload, key=job.key,
                   headers=[*job.headers(), (HEADER_TENANT, raw)])
    await t.run_until_idle()
    assert seen == {}
    assert t.dead_letter_reasons == {"bad-header": len(BAD_HEADERS)}
