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
in-memory transaction) keeps the rows itself, for handler tests without a database; it
runs no other statement (`run_async` and `run_sync` refuse it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from stream_jobs.errors import NotInTransaction, OutboxWriteError
from stream_jobs.outbox.rows import INSERT_NAMES, Placeholders, insert_args, insert_sql

Prepared = Sequence[tuple[str, Any]]  # (topic, record) pairs, as `JobClient.prepare` makes
SqlFor = Callable[[Placeholders], str]  # a statement, spelt for a driver's placeholders
T = TypeVar("T")

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


def _kept_aside(conn: Any, records: Prepared) -> bool:
    """Whether nothing is left to write: no records, or a stand-in of ours kept them."""
    if not records:
        return True
    stand_in = _stand_in(conn, _family(conn))
    if stand_in is None:
        return False
    stand_in.keep_outbox_rows(records)
    return True


async def write_async(conn: Any, records: Prepared, schema: str) -> None:
    """Write `records` through an async connection of the caller's, in its transaction."""
    if _kept_aside(conn, records):
        return
    await run_async(conn, lambda style: insert_sql(schema, style),
                    insert_args(records, schema), INSERT_NAMES, schema)


def write_sync(conn: Any, records: Prepared, schema: str) -> None:
    """Write `records` through a sync connection of the caller's, in its transaction."""
    if _kept_aside(conn, records):
        return
    run_sync(conn, lambda style: insert_sql(schema, style), insert_args(records, schema),
             INSERT_NAMES, schema)


async def run_async(conn: Any, sql: SqlFor, args: Sequence[Any], names: Sequence[str],
                    schema: str, *, fetch: bool = False) -> tuple[Any, ...] | None:
    """Run one statement (`sql(style)` spells it for the driver's placeholders) through an
    async connection of the caller's, in its transaction; with `fetch`, its one row."""
    family = _family(conn)
    if family == "asyncpg":
        if not conn.is_in_transaction():
            raise NotInTransaction(
                "enqueue(conn=...) got an asyncpg connection outside a transaction: a job "
                "written now would exist even if your work rolled back. Enqueue inside "
                "`async with conn.transaction():`.")
        if fetch:
            row = await _guarded(conn.fetchrow(sql("asyncpg"), *args), schema)
            return None if row is None else tuple(row)
        await _guarded(conn.execute(sql("asyncpg"), *args), schema)
        return None
    if family == "sqlalchemy" and hasattr(conn, "sync_session"):  # AsyncSession
        conn = await _guarded(conn.connection(), schema)  # its connection, begun if need be
    if family == "sqlalchemy" and hasattr(conn, "sync_connection"):  # AsyncConnection
        if conn.sync_connection is None:
            raise TypeError("enqueue(conn=...) got a SQLAlchemy AsyncConnection that is not "
                            "started: use `async with engine.connect() as conn:`.")
        _refuse_sqlalchemy_autocommit(conn.sync_connection)
        from sqlalchemy import text

        result = await _guarded(conn.execute(text(sql("named")), _named(names, args)), schema)
        return _first(result) if fetch else None
    raise TypeError(_unknown(conn, "JobClient", "an asyncpg connection, a SQLAlchemy "
                             "AsyncConnection or AsyncSession",
                             "SyncJobClient takes SQLAlchemy Sessions and DB-API connections"))


def run_sync(conn: Any, sql: SqlFor, args: Sequence[Any], names: Sequence[str], schema: str,
             *, fetch: bool = False) -> tuple[Any, ...] | None:
    """`run_async` for a sync connection of the caller's (SQLAlchemy, DB-API, Django)."""
    family = _family(conn)
    if family == "asyncpg" or hasattr(conn, "sync_session") or hasattr(conn, "sync_connection"):
        raise TypeError(_unknown(conn, "SyncJobClient", "a SQLAlchemy Connection or Session, "
                                 "a DB-API connection or django.db.connection",
                                 "JobClient (async) takes asyncpg and SQLAlchemy async ones"))
    if family == "sqlalchemy":
        if hasattr(conn, "get_bind"):  # a Session: its connection, begun if need be
            conn = conn.connection()
        _refuse_sqlalchemy_autocommit(conn)
        from sqlalchemy import text

        result = _run_guarded(lambda: conn.execute(text(sql("named")), _named(names, args)),
                              schema)
        return _first(result) if fetch else None
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

    def run() -> tuple[Any, ...] | None:
        cursor = conn.cursor()
        try:
            cursor.execute(sql("format"), tuple(args))
            row = cursor.fetchone() if fetch else None
        finally:
            cursor.close()
        return None if row is None else tuple(row)

    return _run_guarded(run, schema)


def _named(names: Sequence[str], args: Sequence[Any]) -> dict[str, Any]:
    return dict(zip(names, args, strict=True))


def _first(result: Any) -> tuple[Any, ...] | None:
    row = result.first()
    return None if row is None else tuple(row)


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


def _run_guarded(call: Callable[[], T], schema: str) -> T:
    try:
        return call()
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


__all__ = ["OutboxStandIn", "run_async", "run_sync", "write_async", "write_sync"]
