"""Writing jobs into the caller's transaction: one adapter per kind of connection.

`enqueue(..., conn=conn)` hands over whatever connection the caller's code already
holds, and the rows go through it, so they commit or roll back with the caller's own
writes. Async (`JobClient`): an asyncpg connection, a SQLAlchemy `AsyncConnection` or
`AsyncSession`. Sync (`SyncJobClient`): a SQLAlchemy `Connection` or `Session`, a DB-API
connection (psycopg 3, psycopg2), or Django's `django.db.connection`.

A connection in autocommit is refused (`NotInTransaction`) before anything is written:
the row would commit at once and the job could run for a transaction that then rolls
back. SQLAlchemy and DB-API connections begin a transaction with their first statement
(so ours may be the first), and that is what the caller's commit ends. A driver error
is wrapped into `OutboxWriteError`; the caller's transaction is then failed, as after
any failed write of theirs, and must be rolled back.

Nothing here imports a driver: the connection's kind is read from its class, so only the
caller's own driver has to be installed. An `OutboxStandIn` (`stream_jobs.testing`'s
in-memory transaction) keeps the rows itself, for handler tests without a database.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from stream_jobs.errors import NotInTransaction, OutboxWriteError
from stream_jobs.outbox.rows import insert_args, insert_sql, named_args

Prepared = Sequence[tuple[str, Any]]  # (topic, record) pairs, as `JobClient.prepare` makes

# SQLSTATEs of a missing table or schema: `db migrate` was not run there.
_NOT_MIGRATED = {"42P01", "3F000"}
# psycopg's TransactionStatus.INTRANS (and psycopg2's TRANSACTION_STATUS_INTRANS).
_INTRANS = 2




@runtime_checkable
class OutboxStandIn(Protocol):
    """A transaction without a database that keeps outbox rows until it commits."""

    def keep_outbox_rows(self, records: Prepared) -> None: ...


def _family(conn: object) -> str:
    return type(conn).__module__.split(".", 1)[0]


def _stand_in(conn: object, family: str) -> OutboxStandIn | None:
    # Only objects of our own package are asked: a real driver's never pays the check.
    return conn if family == "stream_jobs" and isinstance(conn, OutboxStandIn) else None


async def write_async(conn: Any, records: Prepared, schema: str) -> None:
    """Write `records` through an async connection of the caller's, in its transaction."""
    if not records:
        return
    family = _family(conn)
    args = insert_args(records, schema)
    if family == "asyncpg":
        if not conn.is_in_transaction():
            raise NotInTransaction(
                "enqueue(conn=...) got an asyncpg connection outside a transaction: a job "
                "written now would exist even if your work rolled back. Enqueue inside "
                "`async with conn.transaction():`.")
        await _guarded(conn.execute(insert_sql(schema, "asyncpg"), *args), schema)
        return
    if family == "sqlalchemy" and hasattr(conn, "sync_session"):  # AsyncSession
        conn = await _guarded(conn.connection(), schema)  # its connection, begun if need be
    if family == "sqlalchemy" and hasattr(conn, "sync_connection"):  # AsyncConnection
        if conn.sync_connection is None:
            raise TypeError("enqueue(conn=...) got a SQLAlchemy AsyncConnection that is not "
                            "started: use `async with engine.connect() as conn:`.")
        _refuse_sqlalchemy_autocommit(conn.sync_connection)
        from sqlalchemy import text

        await _guarded(conn.execute(text(insert_sql(schema, "named")), named_args(args)),
                       schema)
        return
    stand_in = _stand_in(conn, family)
    if stand_in is not None:
        stand_in.keep_outbox_rows(records)
        return
    raise TypeError(_unknown(conn, "JobClient", "an asyncpg connection, a SQLAlchemy "
                             "AsyncConnection or AsyncSession",
                             "SyncJobClient takes SQLAlchemy Sessions and DB-API connections"))


def write_sync(conn: Any, records: Prepared, schema: str) -> None:
    """Write `records` through a sync connection of the caller's, in its transaction."""
    if not records:
        return
    family = _family(conn)
    stand_in = _stand_in(conn, family)
    if stand_in is not None:
        stand_in.keep_outbox_rows(records)
        return
    args = insert_args(records, schema)
    if family == "asyncpg" or hasattr(conn, "sync_session") or hasattr(conn, "sync_connection"):
        raise TypeError(_unknown(conn, "SyncJobClient", "a SQLAlchemy Connection or Session, "
                                 "a DB-API connection or django.db.connection",
                                 "JobClient (async) takes asyncpg and SQLAlchemy async ones"))
    if family == "sqlalchemy":
        if hasattr(conn, "get_bind"):  # a Session: its connection, begun if need be
            conn = conn.connection()
        _refuse_sqlalchemy_autocommit(conn)
        from sqlalchemy import text

        _run_guarded(lambda: conn.execute(text(insert_sql(schema, "named")), named_args(args)),
                     schema)
        return
    if callable(getattr(conn, "get_autocommit", None)) and hasattr(conn, "in_atomic_block"):
        if conn.get_autocommit():  # Django: autocommit mode, outside transaction.atomic()
            raise NotInTransaction(
                "enqueue(conn=...) got Django's connection in autocommit mode: a job written "
                "now would exist even if the request's work rolled back. Enqueue inside "
                "`with transaction.atomic():` (or ATOMIC_REQUESTS).")
    elif not callable(getattr(conn, "cursor", None)):
        raise TypeError(_unknown(conn, "SyncJobClient", "a SQLAlchemy Connection or Session, "
                                 "a DB-API connection or django.db.connection", ""))
    elif not _dbapi_in_transaction(conn):
        raise NotInTransaction(
            "enqueue(conn=...) got a DB-API connection in autocommit outside a transaction: "
            "a job written now would exist even if your work rolled back. Turn autocommit "
            "off, or enqueue inside `with conn.transaction():`.")

    def run() -> None:
        cursor = conn.cursor()
        try:
            cursor.execute(insert_sql(schema, "format"), args)
        finally:
            cursor.close()

    _run_guarded(run, schema)


def _dbapi_in_transaction(conn: Any) -> bool:
    """True unless the connection is in autocommit with no transaction open (a PEP 249
    connection begins one implicitly with its first statement when autocommit is off)."""
    if getattr(conn, "autocommit", False) is not True:
        return True
    status = getattr(getattr(conn, "info", None), "transaction_status", None)  # psycopg 3
    if status is None and callable(getattr(conn, "get_transaction_status", None)):
        status = conn.get_transaction_status()  # psycopg2
    return status is not None and int(status) == _INTRANS


def _refuse_sqlalchemy_autocommit(conn: Any) -> None:
    autocommit = getattr(conn, "_is_autocommit_isolation", None)
    if callable(autocommit):
        on = bool(autocommit())
    else:  # should SQLAlchemy rename it: the execution option is the usual way to set it
        on = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
    if on:
        raise NotInTransaction(
            "enqueue(conn=...) got a SQLAlchemy connection with isolation_level AUTOCOMMIT: "
            "a job written now would exist even if your work rolled back. Use a connection "
            "or session without it.")


async def _guarded(awaitable: Any, schema: str) -> Any:
    try:
        return await awaitable
    except Exception as exc:
        raise _write_failed(exc, schema) from exc


def _run_guarded(call: Any, schema: str) -> None:
    try:
        call()
    except Exception as exc:
        raise _write_failed(exc, schema) from exc


def _write_failed(exc: Exception, schema: str) -> OutboxWriteError:
    if _sqlstate(exc) in _NOT_MIGRATED:
        return OutboxWriteError(
            f"There is no outbox table in schema {schema!r} of the database this connection "
            "is on: run `stream-jobs db migrate` against it (STREAM_JOBS_DATABASE_URL, "
            "STREAM_JOBS_DATABASE_SCHEMA), then roll back and retry.")
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return OutboxWriteError(
        f"The job could not be written to the outbox in your transaction ({detail}): roll "
        "the transaction back; nothing of it is committed.")


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE behind a driver error, through SQLAlchemy's and Django's wrappers."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if isinstance(code, str):
            return code
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def _unknown(conn: object, client: str, takes: str, other: str) -> str:
    kind = f"{type(conn).__module__}.{type(conn).__qualname__}"
    tail = f" ({other})" if other else ""
    return f"{client}.enqueue(conn=...) takes {takes}, not a {kind}{tail}."


__all__ = ["write_async", "write_sync"]
