"""Enqueue jobs: `JobClient` for async code, `SyncJobClient` for sync web code.

`enqueue` returns the job ID once the broker has acknowledged the record (acks=all,
idempotent producer); it never waits on workers. Everything that can be checked (type
declared, lane declared, payload JSON-able, within the size limit, fitting its model)
is checked before anything is sent.

With `conn=` (a connection of the caller's, inside a transaction) the job is written to
the outbox table in that transaction instead, and exists if and only if it commits; a
relay then moves it to Kafka (`stream_jobs.outbox`). The ID is returned at once, and no
Kafka connection is needed: such a client need not be entered.

`result` waits for a kept result (docs/results.md), `status` says where a job is, and
`chain` / `batch` make workflows whose next steps and callbacks are written exactly once
(docs/workflows.md).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from stream_jobs import clock
from stream_jobs.dedup.results import ResultReader
from stream_jobs.errors import (
    ConfigError,
    PayloadError,
    PayloadTooLarge,
    ResultNotKept,
    ResultTimeout,
)
from stream_jobs.job_ids import MAX_JOB_ID_CHARS, new_job_id
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka.clients import AIOKAFKA, KafkaClients, Producer
from stream_jobs.lookup import JobLocation, locate_job
from stream_jobs.naming import lane_topic, tier_topic
from stream_jobs.outbox.writer import write_async, write_sync
from stream_jobs.payloads import encode_payload, validation_summary
from stream_jobs.record import JobRecord
from stream_jobs.retry import tier_for_delay
from stream_jobs.settings import Settings
from stream_jobs.workflows.create import (
    Plan,
    batch_plan,
    chain_plan,
    write_plan,
    write_plan_alone,
)
from stream_jobs.workflows.progress import Progress, read_progress

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Seconds = float | int | timedelta


@dataclass(frozen=True)
class Job:
    """One job for `enqueue_many`; the fields mean what `enqueue`'s arguments mean."""

    job_type: str
    payload: BaseModel | Mapping[str, Any]
    key: str | bytes | None = None
    job_id: str | None = None
    priority: str = "default"
    delay: Seconds | None = None
    run_at: datetime | None = None
    expires_in: Seconds | None = None


def _seconds(value: Seconds, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ConfigError(f"{what} must not be negative (got {seconds:g} s).")
    return seconds


class JobClient:
    """Async enqueueing; use as `async with app.client() as client:`."""

    def __init__(self, settings: Settings, job_types: Mapping[str, JobTypePolicy], *,
                 models: Mapping[str, type[BaseModel]] | None = None,
                 kafka: KafkaClients = AIOKAFKA, kept: Mapping[str, float] | None = None) -> None:
        self.settings = settings
        self._types = dict(job_types)
        self._models = dict(models or {})
        self._kafka = kafka
        self._kept = dict(kept or {})  # types with keep_result: seconds kept
        self._producer_or_none: Producer | None = None
        self._results: ResultReader | None = None

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
        if self._results is not None:
            await self._results.close()
            self._results = None
        if self._producer_or_none is not None:
            await self._producer_or_none.stop()
            self._producer_or_none = None

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
        conn: Any = None,
    ) -> str:
        """Write one job and return its ID once the broker has it.

        `key` orders jobs (same key, same partition, in order; default: the job ID).
        `job_id` given by the caller is kept, so a retried enqueue is deduplicated by
        `ctx.once()`. `delay`/`run_at` hold the job in a delay tier until then.
        `expires_in` drops the job (counted as expired) if it has not run by then.
        `conn` (asyncpg connection, SQLAlchemy AsyncConnection or AsyncSession, in a
        transaction): write the job in that transaction instead; see the module's docstring.
        """
        topic, record = self.prepare(Job(job_type, payload, key, job_id, priority, delay,
                                         run_at, expires_in))
        if conn is not None:
            await write_async(conn, [(topic, record)], self.settings.database_schema)
            return record.job_id
        await self._producer.send(topic, record)
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
        await self._producer.send_many(prepared)
        return [record.job_id for _, record in prepared]

    # -- results and status ------------------------------------------------------------------

    # `timeout` is the contract's name (DESIGN.md): a wait bounded by the call itself.
    async def result(self, job_id: str, *, timeout: float = 30.0,  # noqa: ASYNC109
                     model: type[M] | None = None) -> Any:
        """The job's kept result, waiting up to `timeout` seconds for it (woken by the
        worker's commit, not by polling); validated by `model` if given.

        Raises `JobFailed` (dead-lettered), `JobCancelled` or `JobExpired` with the
        reason; `ResultTimeout` when the job has not finished in time; `ResultNotKept`
        when it finished but no result of it is kept (no `keep_result`, or pruned).
        """
        if self._results is None:
            self._results = ResultReader(self.settings)
        found = await self._results.wait(job_id, timeout)
        if found is None:
            raise await self._no_result(job_id, timeout)
        if not found.succeeded:
            raise found.failure()
        return found.parsed(model) if model is not None else found.value()

    async def _no_result(self, job_id: str, waited_s: float) -> Exception:
        assert self._results is not None
        job_type = await self._results.finished_type(job_id)
        if job_type is not None:
            why = ("its type keeps no results: declare it with @app.job(..., keep_result="
                   "'1d')" if job_type not in self._kept else "its result was pruned")
            return ResultNotKept(f"Job {job_id} ({job_type}) finished, but no result of it "
                                 f"is kept: {why}.")
        return ResultTimeout(f"Job {job_id} has no result after {waited_s:g} s: it has not "
                             f"finished yet (`stream-jobs job {job_id}` says where it is).")

    async def status(self, job_id: str, *, job_type: str | None = None) -> JobLocation:
        """Where the job is: what `stream-jobs job ID` shows (the dedup and results rows,
        then a bounded scan of the type's topics)."""
        return await locate_job(self.settings, self._types, job_id, job_type=job_type)

    # -- chains and batches --------------------------------------------------------------

    async def chain(self, *jobs: Job, chain_id: str | None = None, conn: Any = None) -> str:
        """Run `jobs` one after another: each is enqueued when the one before succeeded,
        with that one's result in `ctx.parent_result`; a step that is dead-lettered stops
        the chain. Returns the chain's ID (`stream-jobs batch ID` shows where it is).
        Written in one transaction (the caller's asyncpg `conn`, or the client's own)."""
        plan = chain_plan(self.settings.database_schema, chain_id or new_job_id(), jobs,
                          self.prepare)
        return await self._write(plan, conn)

    async def batch(self, jobs: Iterable[Job], *, on_success: Job | None = None,
                    on_complete: Job | None = None, batch_id: str | None = None,
                    conn: Any = None) -> str:
        """Enqueue `jobs` as a batch: `on_success` runs once when every member succeeded,
        `on_complete` once when every member finished (dead letters included), however
        often members were retried or delivered again. A callback's payload gets the
        counts under `"batch"` (`BatchSummary`). Returns the batch's ID."""
        plan = batch_plan(self.settings.database_schema, batch_id or new_job_id(), list(jobs),
                          self.prepare, on_success=on_success, on_complete=on_complete)
        return await self._write(plan, conn)

    async def progress(self, workflow_id: str) -> Progress:
        """Where a batch or chain stands (`UnknownWorkflow` if there is none)."""
        return await read_progress(self.settings, workflow_id)

    async def _write(self, plan: Plan, conn: Any) -> str:
        if conn is not None:
            await write_plan(conn, plan)
        else:
            await write_plan_alone(self.settings, plan)
        return plan.workflow_id

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
        job_id = job.job_id or new_job_id()
        if not job_id or len(job_id) > MAX_JOB_ID_CHARS:
            raise ConfigError(f"A job_id must be 1 to {MAX_JOB_ID_CHARS} characters.")
        key = job.key.encode() if isinstance(job.key, str) else job.key
        record = JobRecord(
            job_id=job_id,
            job_type=job.job_type,
            payload=value,
            key=key if key is not None else job_id.encode(),
            enqueued_at_ms=now,
            not_before_ms=not_before if not_before is not None and not_before > now else None,
            expires_at_ms=now + int(expires_s * 1000) if expires_s is not None else None,
            lane=job.priority,
        )
        prefix = self.settings.topic_prefix
        if record.not_before_ms is None:
            return lane_topic(prefix, job.job_type, job.priority), record
        tier = tier_for_delay(policy.retry_tiers, (record.not_before_ms - now) / 1000)
        return tier_topic(prefix, job.job_type, tier), record

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


class SyncJobClient:
    """Blocking enqueueing for sync code (Django/Flask views, scripts).

    Runs a `JobClient` on an event loop in a background thread; safe to share between
    threads. Use as `with app.sync_client() as client:`.
    """

    def __init__(self, settings: Settings, job_types: Mapping[str, JobTypePolicy], *,
                 models: Mapping[str, type[BaseModel]] | None = None,
                 kafka: KafkaClients = AIOKAFKA, kept: Mapping[str, float] | None = None) -> None:
        self._client = JobClient(settings, job_types, models=models, kafka=kafka, kept=kept)
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

    def enqueue(self, job_type: str, payload: BaseModel | Mapping[str, Any], *, conn: Any = None,
                **options: Any) -> str:
        """As `JobClient.enqueue`, blocking until the broker acknowledged the job.

        With `conn` (a SQLAlchemy Connection or Session, a DB-API connection such as
        psycopg's, or Django's `django.db.connection`): written on the calling thread in
        that connection's transaction, returning at once; the client need not be entered.
        """
        if conn is not None:
            return self.enqueue_many([Job(job_type, payload, **options)], conn=conn)[0]
        return self._call(self._client.enqueue(job_type, payload, **options))

    def enqueue_many(self, jobs: Iterable[Job], *, conn: Any = None) -> list[str]:
        if conn is not None:
            prepared = [self._client.prepare(job) for job in jobs]
            write_sync(conn, prepared, self._client.settings.database_schema)
            return [record.job_id for _, record in prepared]
        return self._call(self._client.enqueue_many(list(jobs)))

    def result(self, job_id: str, *, timeout: float = 30.0,
               model: type[M] | None = None) -> Any:
        """As `JobClient.result`, blocking until the result is there (or the timeout)."""
        return self._call(self._client.result(job_id, timeout=timeout, model=model))

    def status(self, job_id: str, *, job_type: str | None = None) -> JobLocation:
        return self._call(self._client.status(job_id, job_type=job_type))

    def chain(self, *jobs: Job, chain_id: str | None = None) -> str:
        return self._call(self._client.chain(*jobs, chain_id=chain_id))

    def batch(self, jobs: Iterable[Job], *, on_success: Job | None = None,
              on_complete: Job | None = None, batch_id: str | None = None) -> str:
        return self._call(self._client.batch(list(jobs), on_success=on_success,
                                             on_complete=on_complete, batch_id=batch_id))

    def progress(self, workflow_id: str) -> Progress:
        return self._call(self._client.progress(workflow_id))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
