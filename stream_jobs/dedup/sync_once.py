"""`with ctx.once_sync(session):` — a job's dedup row in a transaction of the handler's own
connection, for sync handlers.

The async `ctx.once()` hands the handler a connection of ours. Sync code already has its
own: a SQLAlchemy `Session` (also `scoped_session`, e.g. Flask-SQLAlchemy's `db.session`)
or `Connection`, or a DB-API connection (psycopg, psycopg2). The block is that
connection's transaction: entering it inserts the job's row into `stream_jobs_done`
(`ON CONFLICT DO NOTHING`) through the connection, the body writes its effects through
the same connection, and a clean exit commits both together. So the promise is the
async one: the effects happen once per job ID.

- A conflict means an earlier run committed: `AlreadyDone` is raised before the body
  runs, the transaction is rolled back, and the job is acknowledged as a duplicate.
- Two runs racing on one job ID serialise on the primary key, as with `ctx.once()`: the
  second waits for the first's transaction, then sees the conflict (or proceeds if the
  first rolled back).
- The body raising rolls the transaction back (nothing of it is written) and the job
  fails through its tiers; so does a failed insert or commit (`DedupWriteFailed`).
- A transaction already open on the connection is joined: what was done in it before the
  block commits (or rolls back) with it.

The connection must reach the database and schema that hold the dedup table
(`STREAM_JOBS_DATABASE_URL` / `STREAM_JOBS_DATABASE_SCHEMA`; the table name is schema-
qualified, so the connection's search_path does not matter). This module imports
SQLAlchemy only when the caller already has (its objects cannot be SQLAlchemy's
otherwise), so the runtime does not load it for DB-API users.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from stream_jobs.errors import AlreadyDone, ConfigError, DedupWriteFailed

T = TypeVar("T")

_INSERT = ("INSERT INTO {table} (job_id, job_type, attempt) VALUES ({marks}) "
           "ON CONFLICT (job_id) DO NOTHING")


def done_table(schema: str) -> str:
    """The dedup table's schema-qualified name (the schema setting is an identifier)."""
    return '"' + schema.replace('"', '""') + '".stream_jobs_done'


class _Transaction:
    """The three things the block does with a connection, whatever its kind."""

    def __init__(self, claim: Callable[[], int], commit: Callable[[], None],
                 rollback: Callable[[], None]) -> None:
        self.claim = claim
        self.commit = commit
        self.rollback = rollback

    def rollback_quietly(self) -> None:
        # The error that brought us here is the one to report; a connection too broken
        # to roll back is closed by its owner, which rolls back in the server.
        with contextlib.suppress(Exception):
            self.rollback()


def _is_sqlalchemy(target: object) -> bool:
    if "sqlalchemy" not in sys.modules:
        return False  # nobody imported it, so this is not one of its objects
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session, scoped_session

    return isinstance(target, Session | Connection | scoped_session)


def transaction_of(target: Any, table: str, params: tuple[str, str, int]) -> _Transaction:
    """How to claim `params` (job ID, type, attempt) in `table`, commit and roll back on
    `target`; `ConfigError` for an object that is none of the kinds supported."""
    if _is_sqlalchemy(target):
        from sqlalchemy import text

        statement = text(_INSERT.format(table=table, marks=":job_id, :job_type, :attempt"))
        values = dict(zip(("job_id", "job_type", "attempt"), params, strict=True))

        def claim_sqlalchemy() -> int:
            return int(target.execute(statement, values).rowcount)

        return _Transaction(claim_sqlalchemy, target.commit, target.rollback)
    if callable(getattr(target, "cursor", None)) and callable(getattr(target, "commit", None)):
        if getattr(target, "autocommit", False) is True:
            raise ConfigError(f"ctx.once_sync() got a connection in autocommit mode "
                              f"({type(target).__name__}): the dedup row would commit "
                              "before the effects; turn autocommit off on it.")
        sql = _INSERT.format(table=table, marks="%s, %s, %s")

        def claim_dbapi() -> int:
            cursor = target.cursor()
            try:
                cursor.execute(sql, params)
                return int(cursor.rowcount)
            finally:
                cursor.close()

        return _Transaction(claim_dbapi, target.commit, target.rollback)
    raise ConfigError(f"ctx.once_sync() needs a SQLAlchemy Session or Connection, or a DB-API "
                      f"connection (psycopg, psycopg2), not {type(target).__name__}.")


@contextmanager
def once_in(target: T, *, job_id: str, job_type: str, attempt: int, table: str) -> Iterator[T]:
    """The block of `ctx.once_sync(target)`: yields `target` in a transaction that holds
    the job's dedup row, and commits on a clean exit (see the module)."""
    tx = transaction_of(target, table, (job_id, job_type, attempt))
    try:
        claimed = tx.claim()
    except Exception as exc:
        tx.rollback_quietly()
        raise DedupWriteFailed(f"Job {job_id}'s dedup row could not be written through the "
                               f"handler's connection ({type(exc).__name__}: {exc}); the "
                               f"table is {table}, which `stream-jobs db migrate` creates in "
                               "that database.") from exc
    if claimed == 0:
        tx.rollback_quietly()
        raise AlreadyDone(f"job {job_id} already finished")
    try:
        yield target
    except BaseException:
        tx.rollback_quietly()
        raise
    try:
        tx.commit()
    except Exception as exc:
        tx.rollback_quietly()
        raise DedupWriteFailed(f"The commit of job {job_id}'s dedup row and effects failed "
                               f"({type(exc).__name__}: {exc}); the job is retried (a "
                               "duplicate, if the commit landed after all).") from exc
