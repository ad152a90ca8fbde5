"""Reading kept results: one row of `stream_jobs_results`, or a wait for it.

A worker writes a job's row in the transaction that commits the job (its dedup row and
effects), and with it a `NOTIFY` on the results channel of the job's bucket (one of
`CHANNEL_BUCKETS`, from the job ID), delivered at commit. `ResultReader.wait` listens on
its job's channel before it first looks, so a result committed at any moment after the
wait began wakes it: no polling. Buckets rather than one notification per job: Postgres
folds a transaction's equal notifications into one, so a deferred batch of 500 results
sends at most 64 (a NOTIFY per job cost a third of a kept result's write, measured), and
a commit wakes only the waiters of its buckets, who look again. A lost listening
connection wakes every waiter, which looks again and listens anew.

The statements that write rows are the finish transaction's (`stream_jobs.workflows.sql`),
run through `FinishRows` (the dedup store's transactions, and the parent result a chain
step reads); `db prune` removes rows past their `expires_at` (`prune_results`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import asyncpg

from stream_jobs.dedup.deferred import Statement
from stream_jobs.dedup.held import DRIVER_ERRORS, HeldTransaction, ours
from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import ConfigError, DatabaseUnavailable
from stream_jobs.postgres.listening import ListenProbe
from stream_jobs.redaction import redact_text, redact_url
from stream_jobs.results.rules import StoredResult
from stream_jobs.settings import Settings

TABLE = "stream_jobs_results"
_CHANNEL_MAX = 63  # Postgres keeps 63 bytes of an identifier; a channel is one
CONNECT_TIMEOUT_S = 10.0
UNHEARD_READ_EVERY_S = 1.0
# InternalClientError: asyncpg's pool resetting a connection the server has just cut
# (a Postgres restart) can find it mid-operation; to a caller, the database did not answer.
_DRIVER_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                  asyncpg.InternalClientError, TimeoutError)


def results_table(schema: str) -> str:
    """The results table, qualified: callers' connections may have any search_path."""
    return f'"{schema}".{TABLE}'


CHANNEL_BUCKETS = 64


def results_channel(schema: str, job_id: str) -> str:
    """The NOTIFY channel of `job_id`'s bucket in `schema`, for `client.result` waiters."""
    bucket = zlib.crc32(job_id.encode()) % CHANNEL_BUCKETS
    name = f"stream_jobs_results.{schema}.{bucket}"
    if len(name.encode()) <= _CHANNEL_MAX:
        return name
    return f"stream_jobs_results.{hashlib.sha256(schema.encode()).hexdigest()[:32]}.{bucket}"


def select_result_sql(schema: str) -> str:
    """$1 job ID: its row, unless past its expiry (pruning may lag behind); else, for a
    job cancelled before a worker met it, a `cancelled` row made from its cancel."""
    cancels = f'"{schema}".stream_jobs_cancels'
    return ("SELECT job_id, job_type, state, result::text AS result, error, attempt, "
            f"finished_at, expires_at FROM {results_table(schema)} "
            "WHERE job_id = $1 AND expires_at > now() "
            "UNION ALL SELECT c.job_id, c.job_type, 'cancelled', NULL, "
            "'cancelled' || COALESCE(': ' || c.reason, ''), 0, c.cancelled_at, 'infinity' "
            f"FROM {cancels} c WHERE c.job_id = $1 AND NOT EXISTS (SELECT 1 FROM "
            f"{results_table(schema)} r WHERE r.job_id = $1) LIMIT 1")


def stored(row: Any) -> StoredResult:
    return StoredResult(row["job_id"], row["job_type"], row["state"], row["result"],
                        row["error"], row["attempt"], row["finished_at"], row["expires_at"])


class ResultReader:
    """Reads and waits for results; opened lazily, closed with `close()`.

    One listening connection and a small pool for the reads, shared by every wait."""

    def __init__(self, settings: Settings, *, pool_size: int = 4) -> None:
        self._settings = settings
        self._schema = settings.database_schema
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._listener: Any = None
        self._probe: ListenProbe | None = None
        self._listening: set[str] = set()  # the channels (buckets) the listener has
        self._connecting: dict[str, asyncio.Task[None]] = {}  # channel -> its listen
        self.silent_links = 0  # listeners the probe found silent and dropped
        self._opening = asyncio.Lock()  # the pool's
        self._listen_lock = asyncio.Lock()  # the listener's
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._waiting_on: dict[str, set[str]] = {}  # channel -> job IDs waited for
        self._select = select_result_sql(self._schema)

    async def fetch(self, job_id: str) -> StoredResult | None:
        """The job's row, or None (not finished yet, no row kept, or past its expiry)."""
        pool = await self._get_pool()
        try:
            row = await pool.fetchrow(self._select, job_id)
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError) as exc:
            raise ConfigError(f"There is no results table in schema {self._schema!r}: run "
                              "`stream-jobs db migrate` (it creates stream_jobs_results).") \
                from exc
        except _DRIVER_ERRORS as exc:
            raise self._unavailable(exc) from exc
        return None if row is None else stored(row)

    async def wait(self, job_id: str, timeout_s: float) -> StoredResult | None:
        """The job's row once it exists, or None when `timeout_s` passed without one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        woken = asyncio.Event()
        channel = results_channel(self._schema, job_id)
        self._waiters.setdefault(job_id, set()).add(woken)
        self._waiting_on.setdefault(channel, set()).add(job_id)
        try:
            while True:
                listening = timeout_s > 0 and self._heard(channel)
                # Cleared before the read: a commit after the read's snapshot sets it again.
                woken.clear()
                found = await self.fetch(job_id)
                remaining = deadline - loop.time()
                if found is not None or remaining <= 0:
                    return found
                # Without a LISTEN connection (its link is down), read again every second.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), remaining if listening
                                           else min(remaining, UNHEARD_READ_EVERY_S))
        finally:
            waiting = self._waiters.get(job_id)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[job_id]
                    jobs = self._waiting_on.get(channel, set())
                    jobs.discard(job_id)
                    if not jobs:
                        self._waiting_on.pop(channel, None)

    async def close(self) -> None:
        for task in list(self._connecting.values()):
            task.cancel()
        await asyncio.gather(*self._connecting.values(), return_exceptions=True)
        probe, self._probe = self._probe, None
        if probe is not None:
            await probe.stop()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.close(timeout=5)
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                await pool.close()

    async def _get_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    try:
                        self._pool = await asyncpg.create_pool(
                            self._settings.database_url, min_size=0, max_size=self._pool_size,
                            timeout=CONNECT_TIMEOUT_S)
                    except _DRIVER_ERRORS as exc:
                        raise self._unavailable(exc) from exc
        return self._pool

    def _heard(self, channel: str) -> bool:
        """Whether the listener hears `channel` now; if not, it is connected in the
        background (a link that is down must not hold up the reads), and the wait reads
        every UNHEARD_READ_EVERY_S meanwhile."""
        listener = self._listener
        if listener is not None and not listener.is_closed() and channel in self._listening:
            return True
        task = self._connecting.get(channel)
        if task is None or task.done():
            self._connecting[channel] = asyncio.create_task(self._try_listen(channel))
        return False

    async def _try_listen(self, channel: str) -> None:
        try:
            await self._listen(channel)
        except DatabaseUnavailable:
            pass  # the next read's _heard tries again
        finally:
            self._connecting.pop(channel, None)

    async def _listen(self, channel: str) -> None:
        """Make sure the listener is connected and listens on `channel` (it stays
        listening: at most `CHANNEL_BUCKETS` channels)."""
        listener = self._listener
        if listener is not None and not listener.is_closed() and channel in self._listening:
            return
        async with self._listen_lock:
            try:
                if self._listener is None or self._listener.is_closed():
                    if self._probe is not None:
                        await self._probe.stop()
                    listener = await asyncpg.connect(self._settings.listen_url,
                                                     timeout=CONNECT_TIMEOUT_S)
                    listener.add_termination_listener(self._lost)
                    self._listener, self._listening = listener, set()
                    # A link that goes silent is found within ~10 s: the waits read again.
                    self._probe = ListenProbe(listener, self._silent,
                                              what="result waits").start()
                if channel not in self._listening:
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        await self._listener.add_listener(channel, self._notified)
                    self._listening.add(channel)
            except _DRIVER_ERRORS as exc:
                raise self._unavailable(exc) from exc

    def _notified(self, _conn: object, _pid: int, channel: str, _payload: str) -> None:
        for job_id in self._waiting_on.get(channel, ()):
            for woken in self._waiters.get(job_id, ()):
                woken.set()

    def _silent(self) -> None:
        """The probe found the listener silent (it terminated it)."""
        self.silent_links += 1
        self._lost()

    def _lost(self, *_: object) -> None:
        # Whatever was sent meanwhile is unheard: every waiter looks again, and listens anew.
        self._listener, self._listening = None, set()
        for waiting in self._waiters.values():
            for woken in waiting:
                woken.set()

    def _unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        return DatabaseUnavailable(redact_text(
            f"Postgres did not answer at {redact_url(self._settings.database_url)} "
            f"(STREAM_JOBS_DATABASE_URL) for a job's result: {exc}", self._settings))


async def prune_expired(conn: Any, schema: str, batch: int) -> int:
    """Delete up to `batch` result rows past their expiry; how many were deleted."""
    status = await conn.execute(
        f"DELETE FROM {results_table(schema)} WHERE job_id IN (SELECT job_id FROM "
        f"{results_table(schema)} WHERE expires_at <= now() LIMIT $1)", batch)
    return int(status.rsplit(" ", 1)[-1])


__all__ = ["ResultReader", "prune_expired", "results_channel", "results_table",
           "select_result_sql", "stored"]


class FinishRows:
    """The finish transaction's store on Postgres (`stream_jobs.results.finish.FinishStore`):
    the dedup store's held and deferred transactions and single statements, and the kept
    result a chain step reads."""

    def __init__(self, dedup: DedupStore) -> None:
        self.dedup = dedup

    async def hold(self, job_id: str, job_type: str, attempt: int) -> HeldTransaction:
        return await self.dedup.hold(job_id, job_type, attempt)

    async def apply_deferred(self, job_id: str, job_type: str, attempt: int,
                             statements: list[Statement],
                             while_waiting: Callable[[], AbstractContextManager[None]] | None
                             = None) -> bool:
        return await self.dedup.apply_deferred(job_id, job_type, attempt, statements,
                                               while_waiting)

    async def execute(self, sql: str, *args: Any) -> None:
        await self.dedup.execute(sql, *args)

    async def result_of(self, job_id: str) -> StoredResult | None:
        """The job's row of `stream_jobs_results` (a chain step's parent result), or None."""
        try:
            pool = await self.dedup.pool()
            row = await pool.fetchrow(
                select_result_sql(self.dedup.settings.database_schema), job_id)
        except DRIVER_ERRORS as exc:
            raise ours(exc, f"the result of job {job_id} was read") from exc
        return None if row is None else stored(row)


async def prune_results(dedup: DedupStore, *, batch: int = 10_000,
                        dry_run: bool = False) -> int:
    """Delete kept results past their expiry (`keep_result`), `batch` rows per
    transaction; how many (with `dry_run`: how many would be)."""
    pool = await dedup.pool()
    schema = dedup.settings.database_schema
    try:
        if dry_run:
            return int(await pool.fetchval(
                f"SELECT count(*) FROM {results_table(schema)} WHERE expires_at <= now()"))
        deleted = 0
        while True:
            async with pool.acquire() as conn:
                n = await prune_expired(conn, schema, batch)
            deleted += n
            if n < batch:
                return deleted
    except asyncpg.UndefinedTableError:
        return 0  # migrated before results existed: nothing kept, nothing to prune
    except DRIVER_ERRORS as exc:
        raise dedup.failed(exc, "delete expired results") from exc
