"""The outbox relay: moves committed rows of `stream_jobs_outbox` to Kafka.

One round, in one transaction: claim up to `outbox_batch_max` due rows, oldest first,
`FOR UPDATE SKIP LOCKED` (so several relays share the work and never send the same row
at once); leave out rows whose topic and key have an earlier row this relay does not
hold (`rows.sendable`: one key's rows reach their partition in id order, whichever relay
sends them); produce the rest with the idempotent producer (acks=all), a `send_many`
per topic; delete the acknowledged rows; mark the rows of a topic whose write failed
with a retry time; commit. A relay killed between the ack and the commit leaves its
rows in place, and they are sent again: a duplicate with the same job ID, which the
consumer's `ctx.once()` absorbs. Nothing committed is ever lost. A row Kafka could never
take (over the producer's size: another program wrote it into the table) is not sent: it
waits with its reason, and its key's later rows with it (`rows.park_oversized`), so it
holds up no other row.

Between rounds the relay sleeps until a writer's NOTIFY (sent in the writer's
transaction, so delivered at its commit) or a sweep every `outbox_sweep_interval_s`,
which finds rows a killed relay held and rows whose retry came due. No busy polling.
Kafka or Postgres being away is waited out with backoff; the relay never gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg

from stream_jobs.errors import BadRecord, DatabaseUnavailable, OutboxWriteError, StreamJobsError
from stream_jobs.kafka.clients import Producer
from stream_jobs.kafka.producer import RECORD_OVERHEAD_BYTES, JobProducer
from stream_jobs.outbox import rows as sql
from stream_jobs.outbox.rows import OutboxRow, decode_headers, retry_delay_s, sendable
from stream_jobs.postgres.listening import ListenProbe
from stream_jobs.record import HEADER_TYPE, JobRecord, decode_record
from stream_jobs.redaction import redact_text, redact_url
from stream_jobs.settings import Settings
from stream_jobs.tracing import Hop, job_spans

log = logging.getLogger("stream_jobs.outbox")

APPLICATION_NAME = "stream-jobs outbox relay"
# While another relay holds earlier rows of a key this relay claimed, it looks again this
# soon (the other one's commit sends no NOTIFY).
HELD_RECHECK_S = 0.05
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.2, 5.0
_COMPLAIN_EVERY_S = 60.0


@dataclass(frozen=True)
class Round:
    """What one round did: rows claimed, sent (and deleted), held back, failed."""

    claimed: int = 0
    sent: int = 0
    held: int = 0
    failed: int = 0
    full: bool = False  # the claim hit the batch limit: more rows are likely waiting


class OutboxRelay:
    """A self-contained service: `await relay.run(stop)` until `stop` is set, or
    `async with relay:` and `await relay.drain()` for a one-off move."""

    def __init__(self, settings: Settings, *, producer: Producer | None = None,
                 batch_max: int | None = None, sweep_interval_s: float | None = None) -> None:
        self.settings = settings
        self.schema = settings.database_schema
        self.batch_max = batch_max or settings.outbox_batch_max
        self.sweep_interval_s = sweep_interval_s or settings.outbox_sweep_interval_s
        # What the producer takes (its max_request_size); a larger row is never sent.
        self.max_record_bytes = settings.max_payload_bytes + RECORD_OVERHEAD_BYTES
        self._producer = producer
        self._owns_producer = producer is None
        self._pool: asyncpg.Pool | None = None
        self._listener: Any = None
        self._probe: ListenProbe | None = None
        self._relistening: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sql = (sql.claim_sql(self.schema), sql.earlier_sql(self.schema),
                     sql.delete_sql(self.schema), sql.retry_sql(self.schema))
        self.moved = 0
        self.rounds = 0
        self.failures = 0  # rounds that failed (Kafka or Postgres away), waited out by `run`
        self._spans = job_spans()  # None unless something records traces
        self._complained: tuple[str, float] | None = None  # the failure last logged, when

    async def __aenter__(self) -> OutboxRelay:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- connections -------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open what is not open yet: the producer, the claim pool and the LISTEN
        connection. Raises our errors (BrokerUnavailable, DatabaseUnavailable)."""
        if self._producer is None:
            producer = JobProducer(self.settings)
            await producer.start()
            self._producer = producer
        if self._pool is None:
            self._pool = await self._db(asyncpg.create_pool(
                self.settings.database_url, min_size=0, max_size=1, timeout=10,
                server_settings={"application_name": APPLICATION_NAME}))
        if self._listener is None:
            await self._open_listener()  # the first time, its errors are the caller's
        elif self._listener.is_closed() and (self._relistening is None
                                             or self._relistening.done()):
            # Lost (closed, or found silent by the probe): connected again beside the
            # rounds, which go on at the sweep's pace meanwhile.
            self._relistening = asyncio.create_task(self._relisten())

    async def _open_listener(self) -> None:
        if self._probe is not None:
            await self._probe.stop()
        listener = await self._db(asyncpg.connect(
            self.settings.listen_url, timeout=10,
            server_settings={"application_name": f"{APPLICATION_NAME} (listen)"}))
        try:
            await self._db(self._listen_on(listener))
        except BaseException:
            listener.terminate()
            raise
        listener.add_termination_listener(self._listener_lost)
        self._listener = listener
        # A link that goes silent is found within ~10 s and connected again.
        self._probe = ListenProbe(listener, self._listener_lost, what="outbox relay").start()
        self._wake.set()  # rows may have been committed while nobody listened

    async def _listen_on(self, listener: Any) -> None:
        async with asyncio.timeout(10):  # a TimeoutError, which _db makes ours
            await listener.add_listener(sql.channel(self.schema), self._notified)

    async def _relisten(self) -> None:
        try:
            await self._open_listener()
        except Exception as exc:  # the next round tries again
            log.debug("outbox relay: LISTEN connection not back yet: %s", exc)
            return
        log.info("outbox relay: LISTEN connection back")

    def _notified(self, *_: object) -> None:
        self._wake.set()

    def _listener_lost(self, *_: object) -> None:
        self._wake.set()  # the next round finds the listener closed and reconnects

    async def close(self) -> None:
        if self._relistening is not None:
            self._relistening.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._relistening
            self._relistening = None
        if self._probe is not None:
            await self._probe.stop()
            self._probe = None
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=5)
            self._listener = None
        if self._pool is not None:
            with contextlib.suppress(Exception):
                await self._pool.close()
            self._pool = None
        if self._producer is not None and self._owns_producer:
            await self._producer.stop()
            self._producer = None

    async def _db(self, awaitable: Any) -> Any:
        """Await a database call; driver errors become ours."""
        try:
            return await awaitable
        except _DRIVER_ERRORS as exc:
            raise _ours(self, exc) from exc

    # -- running -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until `stop` is set; Kafka or Postgres being away is waited out."""
        backoff_s = _BACKOFF_FIRST_S
        try:
            while not stop.is_set():
                try:
                    await self.connect()
                    self._wake.clear()
                    done = await self.relay_once()
                except Exception as exc:
                    self.failures += 1
                    self._complain(exc, backoff_s)
                    # No table yet (never migrated): look again at the sweep's pace.
                    wait_s = (self.sweep_interval_s if isinstance(exc, OutboxWriteError)
                              else backoff_s)
                    await _wait(stop, None, wait_s)
                    backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)
                    continue
                if self._complained is not None:
                    log.info("outbox relay: working again")
                    self._complained = None
                backoff_s = _BACKOFF_FIRST_S
                if done.full and done.sent:
                    continue
                if done.held:
                    await _wait(stop, self._wake, HELD_RECHECK_S)
                elif done.failed:
                    await _wait(stop, self._wake, sql.RETRY_FIRST_S)
                else:
                    await _wait(stop, self._wake, self.sweep_interval_s)
        finally:
            await self.close()

    def _complain(self, exc: Exception, backoff_s: float) -> None:
        """Log a failure: at once when it is a new one, then once a minute while it lasts
        (a worker whose Postgres is away for hours logs a line a minute, not one a round)."""
        what = type(exc).__name__
        now = time.monotonic()
        if self._complained is not None and self._complained[0] == what \
                and now - self._complained[1] < _COMPLAIN_EVERY_S:
            log.debug("outbox relay: %s", exc)
            return
        self._complained = (what, now)
        if isinstance(exc, StreamJobsError):
            log.warning("outbox relay: %s Trying again in %.1f s.", exc, backoff_s)
        else:  # a fault of ours must not end the relay inside a worker
            log.error("outbox relay: a round failed; trying again in %.1f s", backoff_s,
                      exc_info=exc)

    async def drain(self) -> int:
        """Rounds until one finds nothing to send; the rows moved."""
        moved = 0
        while True:
            done = await self.relay_once()
            moved += done.sent
            if done.held:
                await asyncio.sleep(HELD_RECHECK_S)  # another relay holds earlier rows
                continue
            if not done.sent:
                return moved

    async def relay_once(self) -> Round:
        """One round (see the module's docstring)."""
        await self.connect()
        assert self._pool is not None
        claim, earlier_q, delete, retry = self._sql
        self.rounds += 1
        async with _acquired(self, self._pool) as conn, conn.transaction():
            claimed = [_row(r) for r in await conn.fetch(claim, self.batch_max)]
            if not claimed:
                return Round()
            earlier = {(r["topic"], r["key"]): r["first_id"] for r in await conn.fetch(
                earlier_q, claimed[-1].id, [row.id for row in claimed])}
            now, held = sendable(claimed, earlier)
            now, parked = sql.park_oversized(now, self.max_record_bytes)
            sent, failures = await self._send(now)
            if sent:
                await conn.execute(delete, sent)
            failed = [row for row in now if row.topic in failures]
            waits = {row.id: (retry_delay_s(row.attempts + 1), failures[row.topic])
                     for row in failed}
            waits.update({i: (sql.PARKED_RETRY_S, why) for i, why in parked.items()})
            if waits:
                await conn.execute(retry, list(waits), [w for w, _ in waits.values()],
                                   [why for _, why in waits.values()])
        for row_id, why in parked.items():
            log.warning("outbox relay: row %d not sent: %s", row_id, why)
        self.moved += len(sent)
        return Round(len(claimed), len(sent), len(held), len(waits),
                     full=len(claimed) >= self.batch_max)

    async def _send(self, rows: Sequence[OutboxRow]) -> tuple[list[int], dict[str, str]]:
        """Produce `rows`, one `send_many` per topic (a topic that fails holds up no
        other); (ids acknowledged, error per topic that failed)."""
        producer = self._producer
        assert producer is not None
        by_topic: dict[str, list[OutboxRow]] = {}
        for row in rows:
            by_topic.setdefault(row.topic, []).append(row)
        topics = list(by_topic)
        results = await asyncio.gather(
            *(self._send_rows(producer, topic, by_topic[topic]) for topic in topics),
            return_exceptions=True)
        sent: list[int] = []
        failures: dict[str, str] = {}
        for topic, result in zip(topics, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                failures[topic] = str(result) or type(result).__name__
                log.warning("outbox relay: %d rows for %s not written, retried soon: %s",
                            len(by_topic[topic]), topic, failures[topic])
            else:
                sent.extend(row.id for row in by_topic[topic])
        return sent, failures


    async def _send_rows(self, producer: Producer, topic: str, rows: list[OutboxRow]
                         ) -> Sequence[object]:
        """One topic's rows, each in its send span when traced: a child of the trace the
        row carries (the attempt that enqueued a child job, the caller's request)."""
        jobs = _jobs_of(rows) if self._spans is not None else None
        if self._spans is None or jobs is None:
            return await producer.send_many([(topic, row) for row in rows])
        return await self._spans.send_many(producer.send_many,
                                           [(topic, job) for job in jobs], Hop.OUTBOX)


def _jobs_of(rows: Sequence[OutboxRow]) -> list[JobRecord] | None:
    """The rows as the jobs they hold, for their send spans; None if one holds no job
    (that batch is sent as it is, untraced)."""
    jobs: list[JobRecord] = []
    for row in rows:
        job_type = dict(row.header_pairs).get(HEADER_TYPE, b"")
        try:
            jobs.append(decode_record(key=row.key, value=row.payload, headers=row.header_pairs,
                                      expected_type=job_type.decode(errors="replace"),
                                      max_payload_bytes=sys.maxsize, check_json=False))
        except BadRecord:
            return None
    return jobs


@asynccontextmanager
async def _acquired(relay: OutboxRelay, pool: asyncpg.Pool) -> AsyncIterator[Any]:
    """A pooled connection whose driver errors (acquire, statements, commit) are ours."""
    try:
        async with pool.acquire() as conn:
            yield conn
    except _DRIVER_ERRORS as exc:
        raise _ours(relay, exc) from exc


_DRIVER_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


def _ours(relay: OutboxRelay, exc: BaseException) -> StreamJobsError:
    if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.InvalidSchemaNameError):
        return OutboxWriteError(
            f"There is no outbox table in schema {relay.schema!r}: run `stream-jobs db "
            "migrate` (STREAM_JOBS_DATABASE_SCHEMA); the relay waits for it.")
    return DatabaseUnavailable(redact_text(f"The outbox relay cannot use Postgres at "
                                           f"{redact_url(relay.settings.database_url)}: {exc}",
                                           relay.settings))


def _row(record: Any) -> OutboxRow:
    try:
        headers = decode_headers(record["headers"])
    except BadRecord as bad:
        # Only another program writing into the table makes such a row. Kept, it would
        # fail every round and hold up every row behind it; sent with the cause as its one
        # header, it reaches its lane's DLQ, where an operator finds it and its bytes.
        log.warning("outbox relay: row %d for %s: %s It is sent without its headers.",
                    record["id"], record["topic"], bad)
        headers = ((sql.HEADER_UNREADABLE, str(bad).encode()),)
    return OutboxRow(record["id"], record["topic"], record["key"], record["value"],
                     headers, record["attempts"])


async def _wait(stop: asyncio.Event, wake: asyncio.Event | None, timeout_s: float) -> None:
    """Until `stop` or `wake` is set, or `timeout_s` passed."""
    waits = [asyncio.ensure_future(stop.wait())]
    if wake is not None:
        waits.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()


@asynccontextmanager
async def background_relay(settings: Settings) -> AsyncIterator[OutboxRelay | None]:
    """A relay running beside the caller's work (every worker runs one), or nothing when
    `STREAM_JOBS_OUTBOX_RELAY` is false. On exit it finishes its round and stops."""
    if not settings.outbox_relay:
        yield None
        return
    relay = OutboxRelay(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop), name="stream-jobs outbox relay")
    try:
        yield relay
    finally:
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except TimeoutError:  # a round stuck on an absent broker: its rows stay, unsent
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = ["OutboxRelay", "Round", "background_relay"]
