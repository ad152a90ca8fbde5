"""Enqueue jobs: `JobClient` for async code, `SyncJobClient` for sync web code.

`enqueue` returns the job ID once the broker has acknowledged the record (acks=all,
idempotent producer); it never waits on workers. Everything that can be checked (type
declared, lane declared, payload JSON-able, within the size limit, fitting its model)
is checked before anything is sent.

With `conn=` (a connection of the caller's, inside a transaction) the job is written to
the outbox table in that transaction instead, and exists if and only if it commits; a
relay then moves it to Kafka (`stream_jobs.outbox`). The ID is returned at once, and no
Kafka connection is needed: such a client need not be entered.

With `unique_key=` or `debounce=` the job always goes through the outbox: its key and its
outbox row commit in one transaction (the caller's, or one of the client's own), and the
answer is an `Enqueued` (a `str`) saying whether this call sent it
(`stream_jobs.unique.rules`). `cancel(job_id)` stops a job that has not finished
(`stream_jobs.cancels.rules`).

`result` waits for a kept result (docs/results.md), `status` says where a job is, and
`chain` / `batch` make workflows whose next steps and callbacks are written exactly once
(docs/workflows.md).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from stream_jobs import clock
from stream_jobs.cancels.rules import Cancellation
from stream_jobs.client_stores import ClientStores, PostgresStores
from stream_jobs.errors import ConfigError, PayloadError, PayloadTooLarge
from stream_jobs.job_ids import MAX_JOB_ID_CHARS, checked_job_id, checked_key, new_job_id
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.jobs import Job as Job
from stream_jobs.jobs import Seconds as Seconds
from stream_jobs.kafka.clients import AIOKAFKA, KafkaClients, Producer
from stream_jobs.lookup import JobLocation
from stream_jobs.naming import lane_topic, tier_topic
from stream_jobs.outbox.writer import write_async, write_sync
from stream_jobs.payloads import encode_payload, validation_summary
from stream_jobs.record import JobRecord
from stream_jobs.results.calls import ResultCalls, SyncResultCalls
from stream_jobs.retry import tier_for_delay
from stream_jobs.settings import Settings
from stream_jobs.tenants import checked_tenant
from stream_jobs.tracing import Hop, job_spans
from stream_jobs.unique.claim import (
    Build,
    KeyAnswer,
    enqueue_keyed_async,
    enqueue_keyed_sync,
)
from stream_jobs.unique.rules import Enqueued, KeyClaim, Window, key_claim
from stream_jobs.workflows.calls import SyncWorkflowCalls, WorkflowCalls

T = TypeVar("T")
def _seconds(value: Seconds, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ConfigError(f"{what} must not be negative (got {seconds:g} s).")
    return seconds


class JobClient(WorkflowCalls, ResultCalls):
    """Async enqueueing; use as `async with app.client() as client:`."""

    def __init__(self, settings: Settings, job_types: Mapping[str, JobTypePolicy], *,
                 models: Mapping[str, type[BaseModel]] | None = None,
                 kafka: KafkaClients = AIOKAFKA,
                 kept: Mapping[str, float | None] | None = None,
                 stores: ClientStores | None = None) -> None:
        self.settings = settings
        self._types = dict(job_types)
        self._models = dict(models or {})
        self._kafka = kafka
        # The types this app has handlers for: seconds each keeps its results (None: none).
        self._kept = dict(kept or {})
        self._producer_or_none: Producer | None = None
        # Cancels, keys, results, workflows, status: Postgres, opened on first use (so a
        # client that uses none never connects), or a JobTester's memory.
        self._stores: ClientStores = stores or PostgresStores(settings)
        self._spans = job_spans()  # None unless something records traces (docs/tracing.md)

    @property
    def _producer(self) -> Producer:
        if self._producer_or_none is None:
            raise RuntimeError("Use the client as `async with app.client() as client:`.")
        return self._producer_or_none

    async def __aenter__(self) -> JobClient:
        # aiokafka binds to the running loop, so the producer is made here, not in __init__.
        self._producer_or_none = self._kafka.producer(self.settings)
        await self._producer_or_none.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._producer_or_none is not None:
            await self._producer_or_none.stop()
            self._producer_or_none = None
        await self.close_database()

    async def close_database(self) -> None:
        """Close the Postgres connections of cancels, unique enqueues and results, if any
        were made."""
        await self._stores.close()

    @overload
    async def enqueue(
        self, job_type: str, payload: BaseModel | Mapping[str, Any], *,
        key: str | bytes | None = None, job_id: str | None = None, priority: str = "default",
        delay: Seconds | None = None, run_at: datetime | None = None,
        expires_in: Seconds | None = None, tenant: str | None = None, conn: Any = None,
        unique_key: None = None, unique_for: None = None, debounce: None = None) -> str: ...

    @overload
    async def enqueue(
        self, job_type: str, payload: BaseModel | Mapping[str, Any], *,
        key: str | bytes | None = None, job_id: str | None = None, priority: str = "default",
        delay: Seconds | None = None, run_at: datetime | None = None,
        expires_in: Seconds | None = None, tenant: str | None = None, conn: Any = None,
        unique_key: str, unique_for: Window | None = None, debounce: Window | None = None
    ) -> Enqueued: ...

    @overload
    async def enqueue(
        self, job_type: str, payload: BaseModel | Mapping[str, Any], *,
        key: str | bytes | None = None, job_id: str | None = None, priority: str = "default",
        expires_in: Seconds | None = None, tenant: str | None = None, conn: Any = None,
        unique_key: str | None = None, debounce: Window) -> Enqueued: ...

    async def enqueue(
        self,
        job_type: str,
        payload: BaseModel | Mapping[str, Any],
        *,
        key: str | bytes | None = None,
        job_id: str | None = None,
        priority: str = "default",
        delay: Seconds | None = None,
        run_at: datetime | None = None,
        expires_in: Seconds | None = None,
        tenant: str | None = None,
        conn: Any = None,
        unique_key: str | None = None,
        unique_for: Window | None = None,
        debounce: Window | None = None,
    ) -> str:
        """Write one job and return its ID once the broker has it.

        `key` orders jobs (same key, same partition, in order; default: the job ID).
        `job_id` given by the caller is kept, so a retried enqueue is deduplicated by
        `ctx.once()`. `delay`/`run_at` hold the job in a delay tier until then.
        `expires_in` drops the job (counted as expired) if it has not run by then.
        `tenant` names the customer the job is for (`ctx.tenant`; fair dispatch and
        per-tenant limits, docs/fairness.md): text of 1 to 128 bytes of UTF-8 with no
        control character, else `ConfigError`.
        `conn` (asyncpg connection, SQLAlchemy AsyncConnection or AsyncSession, in a
        transaction): write the job in that transaction instead; see the module's docstring.

        `unique_key` (with `unique_for`, e.g. "10m"): while a job holding the key is
        pending, or within `unique_for` of its enqueue, send nothing and answer that job's
        ID. `debounce` (e.g. "30s", on `unique_key` or else `key`): of the key's jobs
        enqueued in one window only the last runs, when the window ends. Either returns an
        `Enqueued`, which is the job ID and says whether this call sent it; the job goes
        through the outbox (docs/control.md).
        """
        job = Job(job_type, payload, key, job_id, priority, delay, run_at, expires_in, tenant)
        if unique_key is not None or unique_for is not None or debounce is not None:
            claim = key_claim(unique_key=unique_key, unique_for=unique_for, debounce=debounce,
                              key=key, delay=delay, run_at=run_at)
            assert claim is not None
            return await self.enqueue_keyed(job, claim, conn)
        topic, record = self.prepare(job)
        if conn is not None:
            await write_async(conn, [(topic, record)], self.settings.database_schema)
            return record.job_id
        if self._spans is None:
            await self._producer.send(topic, record)
        else:
            await self._spans.send(self._producer.send, topic, record, Hop.ENQUEUE)
        return record.job_id

    async def enqueue_many(self, jobs: Iterable[Job], *, conn: Any = None) -> list[str]:
        """Write a batch pipelined (one round of acknowledgements); returns the IDs in order.

        Every job is checked before any is sent. If the broker fails part-way some jobs
        may be written: enqueue again with the same IDs and `ctx.once()` dedups them.
        With `conn`, all of them are written in the caller's transaction (one statement).
        """
        prepared = [self.prepare(job) for job in jobs]
        if conn is not None:
            await write_async(conn, prepared, self.settings.database_schema)
            return [record.job_id for _, record in prepared]
        if self._spans is None:
            await self._producer.send_many(prepared)
        else:
            await self._spans.send_many(self._producer.send_many, prepared, Hop.ENQUEUE)
        return [record.job_id for _, record in prepared]

    async def enqueue_keyed(self, job: Job, claim: KeyClaim, conn: Any = None) -> Enqueued:
        """`enqueue` of a job with a unique or debounce `claim` (see `enqueue`)."""
        job_id, build = self.prepare_keyed(job, claim)
        schema = self.settings.database_schema
        if conn is not None:
            answer = await enqueue_keyed_async(conn, claim, job.job_type, job_id, schema, build)
        else:
            answer = await self._stores.enqueue_keyed(claim, job.job_type, job_id, build)
        return answer.enqueued()

    def prepare_keyed(self, job: Job, claim: KeyClaim) -> tuple[str, Build]:
        """The job ID of a unique or debounced `job`, and how to make its record once the
        key answered. Every check happens here, before the key is touched: a job that is
        refused takes no key."""
        topic, record = self.prepare(job)
        if claim.kind == "unique":
            record = record.with_(unique_key=claim.key)

        def build(answer: KeyAnswer) -> tuple[str, JobRecord]:
            if claim.kind == "unique" or answer.not_before_ms is None:
                return topic, record
            now = clock.now_ms()
            # A debounced job waits for its window's end, in the delay tier that fits.
            due = answer.not_before_ms if answer.not_before_ms > now else None
            held = record.with_(debounce_key=claim.key, not_before_ms=due)
            return self._route(held, now), held

        return record.job_id, build

    async def cancel(self, job_id: str, *, job_type: str | None = None,
                     reason: str | None = None) -> Cancellation:
        """Cancel a job that has not finished: it never starts (checked before it starts
        and at every delay-tier hop), and a run in progress is interrupted (an async
        handler gets `CancelledError` at its next await; a sync one sees `ctx.cancelled`).
        A job that already finished is left as it is, and the answer says so.

        `job_type` narrows which workers keep the ID (all of the schema's otherwise).
        The answer is decided by the dedup table (docs/control.md): for jobs that write
        through `ctx.once()` it is exact, done or cancelled, never both. Needs Postgres
        only (`STREAM_JOBS_DATABASE_URL`), not Kafka.
        """
        if job_type is not None:
            get_job_type(self._types, job_type)
        if not job_id or len(job_id) > MAX_JOB_ID_CHARS:
            raise ConfigError(f"A job ID is 1 to {MAX_JOB_ID_CHARS} characters.")
        return await self._stores.cancel(job_id, job_type=job_type, reason=reason)

    async def status(self, job_id: str, *, job_type: str | None = None) -> JobLocation:
        """Where the job is: what `stream-jobs job ID` shows (its result too, if kept)."""
        return await self._stores.status(self._types, job_id, job_type=job_type)

    def prepare(self, job: Job, *, now_ms: int | None = None) -> tuple[str, JobRecord]:
        """The topic and record for `job`, or the error that keeps it from being sent."""
        policy = get_job_type(self._types, job.job_type)
        if job.priority not in policy.priorities:
            raise ConfigError(
                f"Job type {job.job_type!r} has no {job.priority!r} lane; it declares "
                f"{', '.join(policy.priorities)} (priorities in topics/{job.job_type}.toml)."
            )
        value = self._encode(job.job_type, job.payload)
        limit = policy.payload_limit(self.settings)
        if len(value) > limit:
            raise PayloadTooLarge(
                f"The {job.job_type} payload is {len(value)} bytes, over the limit of {limit} "
                "(STREAM_JOBS_MAX_PAYLOAD_BYTES): store large data elsewhere and enqueue a "
                "reference to it."
            )
        now = clock.now_ms() if now_ms is None else now_ms
        if job.delay is not None and job.run_at is not None:
            raise ConfigError("Give either delay or run_at, not both.")
        not_before: int | None = None
        if job.delay is not None:
            not_before = now + int(_seconds(job.delay, "delay") * 1000)
        elif job.run_at is not None:
            run_at = job.run_at if job.run_at.tzinfo else job.run_at.replace(tzinfo=UTC)
            not_before = int(run_at.timestamp() * 1000)
        expires_s = (_seconds(job.expires_in, "expires_in") if job.expires_in is not None
                     else policy.expires_in_s)
        # Only an ID given by the caller is checked: a new one is a UUIDv7.
        job_id = checked_job_id(job.job_id) if job.job_id else new_job_id()
        key = checked_key(job.key).encode() if isinstance(job.key, str) else job.key
        tenant = checked_tenant(job.tenant)
        record = JobRecord(
            job_id=job_id,
            job_type=job.job_type,
            payload=value,
            key=key if key is not None else job_id.encode(),
            enqueued_at_ms=now,
            not_before_ms=not_before if not_before is not None and not_before > now else None,
            expires_at_ms=now + int(expires_s * 1000) if expires_s is not None else None,
            lane=job.priority,
            tenant=tenant,
            # A job enqueued under a span (a request's, a parent job's attempt) is in its trace.
            traceparent=self._spans.current_traceparent() if self._spans is not None else None,
        )
        return self._route(record, now, policy), record

    def _route(self, record: JobRecord, now: int, policy: JobTypePolicy | None = None) -> str:
        """The topic of `record`: its lane, or the delay tier that fits its not-before."""
        prefix = self.settings.topic_prefix
        if record.not_before_ms is None or record.not_before_ms <= now:
            return lane_topic(prefix, record.job_type, record.lane)
        policy = policy or get_job_type(self._types, record.job_type)
        tier = tier_for_delay(policy.retry_tiers, (record.not_before_ms - now) / 1000)
        return tier_topic(prefix, record.job_type, tier)

    def _encode(self, job_type: str, payload: BaseModel | Mapping[str, Any]) -> bytes:
        value = encode_payload(payload)
        model = self._models.get(job_type)
        if model is not None and not isinstance(payload, model):
            try:
                model.model_validate_json(value)
            except ValidationError as exc:
                raise PayloadError(f"The {job_type} payload does not fit {model.__name__}: "
                                   f"{validation_summary(exc)}.") from exc
        return value


class SyncJobClient(SyncWorkflowCalls, SyncResultCalls):
    """Blocking enqueueing for sync code (Django/Flask views, scripts).

    Runs a `JobClient` on an event loop in a background thread; safe to share between
    threads. Use as `with app.sync_client() as client:`.
    """

    _client: JobClient

    def __init__(self, settings: Settings, job_types: Mapping[str, JobTypePolicy], *,
                 models: Mapping[str, type[BaseModel]] | None = None,
                 kafka: KafkaClients = AIOKAFKA,
                 kept: Mapping[str, float | None] | None = None,
                 stores: ClientStores | None = None) -> None:
        self._client = JobClient(settings, job_types, models=models, kafka=kafka, kept=kept,
                                 stores=stores)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stream-jobs-client",
                                        daemon=True)

    def __enter__(self) -> SyncJobClient:
        self._thread.start()
        try:
            self._call(self._client.__aenter__())
        except BaseException:
            self._shutdown()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._call(self._client.__aexit__(None, None, None))
        finally:
            self._shutdown()

    @overload
    def enqueue(self, job_type: str, payload: BaseModel | Mapping[str, Any], *,
                conn: Any = None, unique_key: None = None, unique_for: None = None,
                debounce: None = None, **options: Any) -> str: ...

    @overload
    def enqueue(self, job_type: str, payload: BaseModel | Mapping[str, Any], *,
                conn: Any = None, unique_key: str, unique_for: Window | None = None,
                debounce: Window | None = None, **options: Any) -> Enqueued: ...

    @overload
    def enqueue(self, job_type: str, payload: BaseModel | Mapping[str, Any], *,
                conn: Any = None, unique_key: str | None = None, unique_for: None = None,
                debounce: Window, **options: Any) -> Enqueued: ...

    def enqueue(self, job_type: str, payload: BaseModel | Mapping[str, Any], *, conn: Any = None,
                unique_key: str | None = None, unique_for: Window | None = None,
                debounce: Window | None = None, **options: Any) -> str:
        """As `JobClient.enqueue`, blocking until the broker acknowledged the job.

        With `conn` (a SQLAlchemy Connection or Session, a DB-API connection such as
        psycopg's, or Django's `django.db.connection`): written on the calling thread in
        that connection's transaction, returning at once; the client need not be entered.
        `unique_key`, `unique_for` and `debounce` mean what `JobClient.enqueue`'s do; with
        them the answer is an `Enqueued`, once the key and the job are committed.
        """
        if unique_key is not None or unique_for is not None or debounce is not None:
            job = Job(job_type, payload, **options)
            claim = key_claim(unique_key=unique_key, unique_for=unique_for, debounce=debounce,
                              key=job.key, delay=job.delay, run_at=job.run_at)
            assert claim is not None
            if conn is None:
                return self._call(self._client.enqueue_keyed(job, claim))
            job_id, build = self._client.prepare_keyed(job, claim)
            return enqueue_keyed_sync(conn, claim, job.job_type, job_id,
                                      self._client.settings.database_schema, build).enqueued()
        if conn is not None:
            return self.enqueue_many([Job(job_type, payload, **options)], conn=conn)[0]
        sent: str = self._call(self._client.enqueue(job_type, payload, **options))
        return sent

    def cancel(self, job_id: str, *, job_type: str | None = None,
               reason: str | None = None) -> Cancellation:
        """As `JobClient.cancel`, blocking."""
        return self._call(self._client.cancel(job_id, job_type=job_type, reason=reason))

    def enqueue_many(self, jobs: Iterable[Job], *, conn: Any = None) -> list[str]:
        if conn is not None:
            prepared = [self._client.prepare(job) for job in jobs]
            write_sync(conn, prepared, self._client.settings.database_schema)
            return [record.job_id for _, record in prepared]
        return self._call(self._client.enqueue_many(list(jobs)))

    def status(self, job_id: str, *, job_type: str | None = None) -> JobLocation:
        return self._call(self._client.status(job_id, job_type=job_type))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
