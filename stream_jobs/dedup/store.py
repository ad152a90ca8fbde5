"""The dedup table that makes a job's effects happen once per job ID.

`stream_jobs_done(job_id PK, job_type, attempt, finished_at)`. A handler's
`async with ctx.once() as conn:` inserts its row `ON CONFLICT DO NOTHING` in a
transaction that also carries the handler's own writes, so both commit or neither does.
A conflict means an earlier run committed: the body does not run (`AlreadyDone`).
Two runs racing on one job ID serialise on the primary key: the second waits for the
first's transaction and then sees the conflict, or proceeds if the first rolled back.

SQLAlchemy owns the schema (`stream_jobs.postgres.schema`); the hot path talks to asyncpg.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    nullcontext,
)
from datetime import datetime
from typing import Any, Protocol, TypeVar

import asyncpg

from stream_jobs.dedup.deferred import DeferredBlock, Statement, WriteBatcher
from stream_jobs.dedup.fencing import TokenIssuer
from stream_jobs.dedup.group_commit import INSERT_DONE, GroupCommitter
from stream_jobs.dedup.held import DRIVER_ERRORS, HeldTransaction, ours
from stream_jobs.dedup.sync_once import done_table, once_in
from stream_jobs.errors import AlreadyDone, ConfigError, DatabaseUnavailable, StreamJobsError
from stream_jobs.postgres.migrate import Migration, migrate
from stream_jobs.postgres.names import FENCING_SEQUENCE
from stream_jobs.postgres.pool import REFUSED, not_connected
from stream_jobs.redaction import redact_text
from stream_jobs.settings import Settings

# Opening a connection failed: Postgres is down, refusing, or still starting.
_UNREACHABLE = (OSError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError)

_FETCH_TOKENS = f"SELECT nextval('{FENCING_SEQUENCE}') FROM generate_series(1, $1)"

S = TypeVar("S")


class Dedup(Protocol):
    """What a worker and its jobs' `JobContext` use of a dedup store: `DedupStore` on
    Postgres, or `stream_jobs.testing`'s in-memory one. The meanings are `DedupStore`'s."""

    @property
    def table(self) -> str: ...

    def once(self, job_id: str, job_type: str, attempt: int, *, careful: bool = False
             ) -> AbstractAsyncContextManager[Any]: ...

    def once_deferred(
            self, job_id: str, job_type: str, attempt: int, *,
            while_waiting: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> DeferredBlock: ...

    def once_sync(self, session: S, job_id: str, job_type: str, attempt: int
                  ) -> AbstractContextManager[S]: ...

    def fencing_token(self) -> asyncio.Future[int]: ...

    async def close(self) -> None: ...


class DedupStore:
    """A pool of asyncpg connections to the dedup database; opened lazily, so a worker
    starts while Postgres is down and its `once()` jobs fail (and retry) until it is back."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pool: asyncpg.Pool | None = None
        self._committer: GroupCommitter | None = None
        self._batcher: WriteBatcher | None = None
        self._tokens: TokenIssuer | None = None
        self._token_fetches_closed = 0  # round trips of issuers closed with the store
        # Held transactions (stream_jobs.dedup.held) wait for their handler to return: a
        # pool of their own, so they never starve group commit of connections.
        self._held_pool: asyncpg.Pool | None = None

    @property
    def table(self) -> str:
        """The dedup table's schema-qualified name, for SQL on connections not ours."""
        return done_table(self._settings.database_schema)

    @property
    def settings(self) -> Settings:
        return self._settings

    async def pool(self) -> asyncpg.Pool:
        """The store's pool, opened on first use (`DatabaseUnavailable` if it cannot be),
        for the features' statements that ride on the dedup database's connections."""
        return await self._get_pool()

    def failed(self, exc: BaseException, what: str) -> StreamJobsError:
        """Our error for a driver error met while doing `what` ("count the dedup rows")."""
        return self._failed(exc, what)

    async def _get_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                self._pool = await asyncpg.create_pool(
                    self._settings.database_url,
                    min_size=0,
                    max_size=self._settings.database_pool_size,
                    server_settings={"search_path": self._settings.database_schema,
                                     # group_commit quotes literals under this rule
                                     "standard_conforming_strings": "on"},
                    timeout=10,
                )
            except (OSError, asyncpg.PostgresError) as exc:
                raise self._unavailable(exc) from exc
        return self._pool

    def _unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        return not_connected(self._settings, exc)

    def _failed(self, exc: BaseException, what: str) -> StreamJobsError:
        """Our error for a driver error met while doing `what` ("count the dedup rows")."""
        if isinstance(exc, _UNREACHABLE + REFUSED):
            return self._unavailable(exc)
        schema = self._settings.database_schema
        if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.InvalidSchemaNameError):
            return ConfigError(
                f"Cannot {what}: there is no dedup table in schema {schema!r}; run "
                "`stream-jobs db migrate` (or point STREAM_JOBS_DATABASE_SCHEMA at the schema "
                "that has it).")
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        return DatabaseUnavailable(redact_text(f"Postgres failed to {what}: {detail}.",
                                               self._settings))

    async def close(self) -> None:
        if self._held_pool is not None:
            await self._held_pool.close()
            self._held_pool = None
        if self._tokens is not None:
            await self._tokens.close()
            self._token_fetches_closed += self._tokens.fetches
            self._tokens = None
        if self._batcher is not None:
            await self._batcher.close()
            self._batcher = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def migrate(self) -> Migration:
        """`stream_jobs.postgres.migrate.migrate` of the store's settings."""
        return await migrate(self._settings)
    @asynccontextmanager
    async def once(self, job_id: str, job_type: str, attempt: int, *,
                   careful: bool = False) -> AsyncIterator[Any]:
        """A connection in an open transaction that already holds the job's dedup row.

        Raises `AlreadyDone` (before the body runs) when the row exists. Returns only
        once the row and the body's writes are committed. With group commit (the
        default, `STREAM_JOBS_DEDUP_GROUP_COMMIT`) the transaction is shared with other
        jobs: `RolledBackWithOthers` when another job's failure rolled it back (run the
        body again, `careful`: in its own savepoint); see `stream_jobs.dedup.group_commit`.
        """
        if self._settings.dedup_group_commit:
            if self._committer is None:
                self._committer = GroupCommitter(
                    await self._get_pool(), batch_max=self._settings.dedup_batch_max,
                    linger_s=self._settings.dedup_linger_ms / 1000,
                    parallel=max(1, self._settings.database_pool_size - 2))
            entered = False
            try:
                async with self._committer.once(job_id, job_type, attempt,
                                                careful=careful) as conn:
                    entered = True
                    yield conn
            except _UNREACHABLE as exc:
                if entered:
                    raise
                raise self._unavailable(exc) from exc
            return
        pool = await self._get_pool()
        try:
            conn = await pool.acquire()
        except _UNREACHABLE as exc:
            raise self._unavailable(exc) from exc
        try:
            async with conn.transaction():
                status = await conn.execute(INSERT_DONE, job_id, job_type, attempt)
                if status.endswith(" 0"):
                    raise AlreadyDone(f"job {job_id} already finished")
                yield conn
                # A body that caught a failed statement's error left the transaction
                # aborted; COMMIT would then roll back without asyncpg saying so.
                await conn.execute("SELECT 1")
        finally:
            await pool.release(conn)

    def once_deferred(
            self, job_id: str, job_type: str, attempt: int, *,
            while_waiting: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> _DeferredBlock:
        """A recording the body writes through; on a clean exit its statements and the
        job's dedup row are applied with other jobs' in one transaction, and this returns
        once that committed. Raises `AlreadyDone` (after the body) when the row existed:
        then nothing the body recorded was applied. `while_waiting` wraps the wait for the
        commit. See `stream_jobs.dedup.deferred`."""
        return _DeferredBlock(self, job_id, job_type, attempt, while_waiting)

    def once_sync(self, session: S, job_id: str, job_type: str, attempt: int
                  ) -> AbstractContextManager[S]:
        """`ctx.once_sync(session)`: the job's dedup row in `session`'s own transaction
        (see `stream_jobs.dedup.sync_once`)."""
        return once_in(session, job_id=job_id, job_type=job_type, attempt=attempt,
                       table=self.table)

    async def _deferred_batcher(self) -> WriteBatcher:
        if self._batcher is None:
            # One transaction at a time: under load the claims that wait meanwhile make
            # the next batch bigger, and fewer, bigger commits beat parallel small ones on
            # a WAL flush per commit (measured: 1 ahead of 2, 4 and 8).
            self._batcher = WriteBatcher(
                await self._get_pool(),
                batch_max=self._settings.dedup_batch_max
                if self._settings.dedup_group_commit else 1,
                parallel=1)
        return self._batcher

    async def hold(self, job_id: str, job_type: str, attempt: int) -> HeldTransaction:
        """A transaction of the job's own holding its claimed dedup row, left open for the
        caller to commit (`AlreadyDone` if the row exists). See `stream_jobs.dedup.held`."""
        if self._held_pool is None:
            try:
                self._held_pool = await asyncpg.create_pool(
                    self._settings.database_url, min_size=0,
                    max_size=self._settings.database_pool_size, timeout=10,
                    server_settings={"search_path": self._settings.database_schema})
            except (OSError, asyncpg.PostgresError) as exc:
                raise self._unavailable(exc) from exc
        return await HeldTransaction.begin(self._held_pool, job_id, job_type, attempt)

    async def apply_deferred(self, job_id: str, job_type: str, attempt: int,
                             statements: list[tuple[str, tuple[Any, ...]]],
                             while_waiting: Callable[[], AbstractContextManager[None]] | None
                             = None) -> bool:
        """Claim the job and apply `statements` with the next deferred batch: True once
        committed, False when the row existed (nothing was applied)."""
        try:
            batcher = await self._deferred_batcher()
            with while_waiting() if while_waiting is not None else nullcontext():
                return await batcher.apply(job_id, job_type, attempt, statements)
        except _UNREACHABLE as exc:
            raise self._unavailable(exc) from exc
        except DRIVER_ERRORS as exc:
            raise ours(exc, f"the finish of job {job_id}") from exc

    async def execute(self, sql: str, *args: Any) -> None:
        """One statement in a transaction of its own (a job's terminal result row);
        driver errors as ours."""
        try:
            pool = await self._get_pool()
            await pool.execute(sql, *args)
        except DRIVER_ERRORS as exc:
            raise ours(exc, "a job's result row") from exc

    def fencing_token(self) -> asyncio.Future[int]:
        """A fencing token taken after this call: above every token handed out before it
        (stream_jobs.dedup.fencing). Concurrent requests share one round trip."""
        if self._tokens is None:
            self._tokens = TokenIssuer(self._fetch_tokens)
        return self._tokens.request()

    @property
    def fencing_round_trips(self) -> int:
        """Round trips made for fencing tokens so far (fewer than tokens under load), the
        store's close included (a worker closes its store when it stops)."""
        return self._token_fetches_closed + (0 if self._tokens is None else self._tokens.fetches)

    async def _fetch_tokens(self, n: int) -> list[int]:
        pool = await self._get_pool()
        try:
            rows = await pool.fetch(_FETCH_TOKENS, n)
        except asyncpg.UndefinedTableError as exc:
            raise ConfigError(
                f"There is no fencing token sequence ({FENCING_SEQUENCE}) in schema "
                f"{self._settings.database_schema!r}: run `stream-jobs db migrate`.") from exc
        except _UNREACHABLE as exc:
            raise self._unavailable(exc) from exc
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise DatabaseUnavailable(f"Postgres gave no fencing token: {exc}") from exc
        return [int(row[0]) for row in rows]

    async def finished(self, job_id: str) -> tuple[str, int, datetime] | None:
        """(job_type, attempt, finished_at) of a finished job, or None. Driver errors are
        the caller's (`stream_jobs.lookup` turns each into a note)."""
        pool = await self._get_pool()
        row = await pool.fetchrow(
            "SELECT job_type, attempt, finished_at FROM stream_jobs_done WHERE job_id = $1", job_id
        )
        return None if row is None else (row["job_type"], row["attempt"], row["finished_at"])

    async def prune_plan(self, older_than_s: float) -> tuple[datetime, int]:
        """The cutoff (the database's clock, which wrote `finished_at`, less `older_than_s`)
        and how many rows finished before it."""
        try:
            pool = await self._get_pool()
            row = await pool.fetchrow(
                "SELECT c.cutoff, (SELECT count(*) FROM stream_jobs_done "
                "WHERE finished_at < c.cutoff) AS n "
                "FROM (SELECT now() - make_interval(secs => $1) AS cutoff) c",
                float(older_than_s))
        except DRIVER_ERRORS as exc:
            raise self._failed(exc, "count the dedup rows to prune") from exc
        return row["cutoff"], int(row["n"])

    async def prune(self, older_than_s: float, *, batch: int = 10_000, dry_run: bool = False,
                    progress: Callable[[int, int], object] | None = None
                    ) -> tuple[datetime, int, int]:
        """Delete the rows finished more than `older_than_s` ago, `batch` rows per
        transaction, oldest first: (cutoff, rows that matched, rows deleted). Safe to
        interrupt and run again. `progress(deleted, matched)` is called after each batch."""
        cutoff, matched = await self.prune_plan(older_than_s)
        deleted = 0
        while matched and not dry_run:
            n = await self.prune_batch(cutoff, batch)
            deleted += n
            if progress is not None:
                progress(deleted, matched)
            if n < batch:
                break
        return cutoff, matched, deleted

    async def prune_batch(self, cutoff: datetime, limit: int) -> int:
        """Delete up to `limit` rows finished before `cutoff`, oldest first, in one short
        transaction (so locks and WAL stay small); how many were deleted."""
        try:
            pool = await self._get_pool()
            status = await pool.execute(
                "DELETE FROM stream_jobs_done WHERE job_id IN (SELECT job_id FROM "
                "stream_jobs_done WHERE finished_at < $1 ORDER BY finished_at LIMIT $2)",
                cutoff, limit)
        except DRIVER_ERRORS as exc:
            raise self._failed(exc, "delete old dedup rows") from exc
        return int(status.rsplit(" ", 1)[-1])

    async def count(self, job_type: str | None = None) -> int:
        """Dedup rows, of every type or of `job_type`."""
        try:
            pool = await self._get_pool()
            if job_type is None:
                return int(await pool.fetchval("SELECT count(*) FROM stream_jobs_done"))
            return int(await pool.fetchval(
                "SELECT count(*) FROM stream_jobs_done WHERE job_type = $1", job_type))
        except DRIVER_ERRORS as exc:
            raise self._failed(exc, "count the dedup rows") from exc


class _DeferredBlock(DeferredBlock):
    """`async with store.once_deferred(...) as writes:` on Postgres: the recording joins
    the store's next write batch."""

    __slots__ = ("_store", "_waiting")

    def __init__(self, store: DedupStore, job_id: str, job_type: str, attempt: int,
                 while_waiting: Callable[[], AbstractContextManager[None]] | None) -> None:
        super().__init__(job_id, job_type, attempt)
        self._store = store
        self._waiting = while_waiting

    async def _apply(self, statements: list[Statement]) -> None:
        store = self._store
        try:
            batcher = await store._deferred_batcher()
            with self._waiting() if self._waiting is not None else nullcontext():
                applied = await batcher.apply(self._job_id, self._job_type, self._attempt,
                                              statements)
        except _UNREACHABLE as exc:
            raise store._unavailable(exc) from exc
        if not applied:
            raise AlreadyDone(f"job {self._job_id} already finished")
