"""A held transaction: one job's dedup row and effects, committed when the handler returns.

`ctx.once()` normally commits at the end of its block (with other jobs', by group
commit). A job whose finish must join that transaction (a type with `keep_result`, a
batch member, a chain step: `stream_jobs.results.finish`) gets a transaction of its
own instead, on a connection of a pool kept for them: the claim is made when the block
opens, the block's writes go through it, and it stays open past the block until the
handler has returned and the worker has written the job's result and counters in it. So
a handler's effects commit when it returns, not at the end of its block.

Driver errors are ours here: `DatabaseUnavailable` when Postgres cannot be reached,
`FinishFailed` when a statement or the commit failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

import asyncpg

from stream_jobs.dedup.group_commit import INSERT_DONE
from stream_jobs.errors import AlreadyDone, DatabaseUnavailable, FinishFailed

_UNREACHABLE = (OSError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError,
                asyncpg.ConnectionDoesNotExistError, TimeoutError)
DRIVER_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)
ROLLBACK_TIMEOUT_S = 5.0  # then the connection is taken for dead


def ours(exc: BaseException, what: str) -> DatabaseUnavailable | FinishFailed:
    """A driver error as one of ours."""
    if isinstance(exc, _UNREACHABLE):
        return DatabaseUnavailable(f"Postgres did not answer while {what}: {exc}")
    return FinishFailed(f"Postgres refused {what}: {type(exc).__name__}: {exc}")


class Held(Protocol):
    """A held transaction as a finish uses it: `HeldTransaction`, or the in-memory one of
    `stream_jobs.testing`."""

    @property
    def conn(self) -> Any: ...

    async def execute(self, sql: str, *args: Any) -> None: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...


class HeldTransaction:
    """An open transaction holding one job's dedup row; `commit` or `rollback` ends it."""

    __slots__ = ("_pool", "_tx", "conn")

    def __init__(self, pool: asyncpg.Pool, conn: Any, tx: Any) -> None:
        self._pool = pool
        self.conn = conn
        self._tx = tx

    @classmethod
    async def begin(cls, pool: asyncpg.Pool, job_id: str, job_type: str,
                    attempt: int) -> HeldTransaction:
        """Claim the job's row in a new transaction; `AlreadyDone` if an earlier run did."""
        try:
            conn = await pool.acquire()
        except DRIVER_ERRORS as exc:
            raise ours(exc, "a connection was opened for a job's finish") from exc
        held = cls(pool, conn, conn.transaction())
        try:
            await held._tx.start()
            status = await conn.execute(INSERT_DONE, job_id, job_type, attempt)
        except BaseException as exc:
            await held.rollback()
            if isinstance(exc, DRIVER_ERRORS):
                raise ours(exc, f"the claim of job {job_id}") from exc
            raise
        if status.endswith(" 0"):
            await held.rollback()
            raise AlreadyDone(f"job {job_id} already finished")
        return held

    async def execute(self, sql: str, *args: Any) -> None:
        try:
            await self.conn.execute(sql, *args)
        except DRIVER_ERRORS as exc:
            raise ours(exc, "a job's result or counters") from exc

    async def commit(self) -> None:
        """Commit; the connection goes back to its pool either way."""
        try:
            # A body that caught a failed statement's error left the transaction aborted;
            # COMMIT would then roll back without asyncpg saying so.
            await self.conn.execute("SELECT 1")
            await self._tx.commit()
        except BaseException as exc:
            await self.rollback()
            if isinstance(exc, DRIVER_ERRORS):
                raise ours(exc, "the commit of a job's finish transaction") from exc
            raise
        await self._release()

    async def rollback(self) -> None:
        try:
            if not self.conn.is_closed() and self.conn.is_in_transaction():
                # Bounded: after a handler's timeout cancelled a statement Postgres never
                # answered, the rollback would wait as long.
                async with asyncio.timeout(ROLLBACK_TIMEOUT_S):
                    await self._tx.rollback()
        except Exception:
            # Ended without a goodbye; Postgres rolls back when it sees the socket close.
            self.conn.terminate()
        await self._release()

    async def _release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await self._pool.release(conn)


__all__ = ["DRIVER_ERRORS", "Held", "HeldTransaction", "ours"]
