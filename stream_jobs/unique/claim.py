"""Unique and debounced enqueues: the key and the job's outbox row in one transaction.

A unique enqueue takes its key with one `INSERT ... ON CONFLICT DO UPDATE`: Postgres
serialises two transactions on one key (the second waits for the first to commit or
roll back, then sees its row), so of two producers racing on a key exactly one takes it.
The statement keeps the holder's row unless the key is free (its job finished and its
`unique_for` window passed) and returns the job that holds it; only if that is this one
does the job's outbox row follow, in the same transaction. So the job exists (and will
reach Kafka through the relay) if and only if its key was taken and the transaction
committed.

A debounced enqueue opens its key's window, or joins the one that is open; the statement
returns the window's end and the job this one replaces, which it marks superseded in the
same statement. The job's outbox row follows with `not-before` at the window's end.

Both run through the caller's connection (`conn=`, any kind the outbox writer takes) or,
without one, in a transaction of the client's own (`enqueue_keyed_own`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from stream_jobs.outbox.rows import Placeholders, spell
from stream_jobs.outbox.writer import run_async, run_sync, write_async, write_sync
from stream_jobs.postgres.pool import DRIVER_ERRORS, LazyPool, database_error
from stream_jobs.record import JobRecord
from stream_jobs.unique.rules import Enqueued, KeyClaim

_NAMES = ("job_type", "claim_key", "job_id", "window_s")

# Free: the holder finished and its window (if any) passed. statement_timestamp() is fixed
# for the statement, so every CASE below sees the same "now".
_FREE = ("(u.finished_at IS NOT NULL AND (u.held_until IS NULL "
         "OR u.held_until <= statement_timestamp()))")
_XID = "pg_current_xact_id()::text::bigint"


def _unique_template(schema: str) -> str:
    taken = ", ".join(f"{column} = CASE WHEN {_FREE} THEN {new} ELSE u.{column} END"
                      for column, new in (("job_id", "EXCLUDED.job_id"),
                                          ("taken_in", "EXCLUDED.taken_in"),
                                          ("taken_at", "statement_timestamp()"),
                                          ("held_until", "EXCLUDED.held_until"),
                                          ("finished_at", "NULL")))
    return (f'INSERT INTO "{schema}".stream_jobs_unique AS u '
            "(job_type, unique_key, job_id, taken_in, held_until) VALUES "
            f"(CAST({{0}} AS text), CAST({{1}} AS text), CAST({{2}} AS text), {_XID}, "
            "statement_timestamp() + make_interval(secs => CAST({3} AS float8))) "
            f"ON CONFLICT (job_type, unique_key) DO UPDATE SET {taken} "
            f"RETURNING u.job_id, u.taken_in = {_XID}, CAST(NULL AS text), "
            "CAST(NULL AS bigint)")


def _debounce_template(schema: str) -> str:
    still_open = "d.window_ends_at > statement_timestamp()"
    return (
        f'WITH opened AS (INSERT INTO "{schema}".stream_jobs_debounce AS d '
        "(job_type, debounce_key, job_id, window_ends_at) VALUES "
        "(CAST({0} AS text), CAST({1} AS text), CAST({2} AS text), "
        "statement_timestamp() + make_interval(secs => CAST({3} AS float8))) "
        "ON CONFLICT (job_type, debounce_key) DO UPDATE SET job_id = EXCLUDED.job_id, "
        f"superseded_job_id = CASE WHEN {still_open} AND d.job_id <> EXCLUDED.job_id "
        "THEN d.job_id END, "
        f"window_ends_at = CASE WHEN {still_open} THEN d.window_ends_at "
        "ELSE EXCLUDED.window_ends_at END "
        "RETURNING d.job_type, d.job_id, d.superseded_job_id, d.window_ends_at), "
        f'marked AS (INSERT INTO "{schema}".stream_jobs_superseded '
        "(job_id, job_type, by_job_id) SELECT superseded_job_id, job_type, job_id "
        "FROM opened WHERE superseded_job_id IS NOT NULL ON CONFLICT (job_id) DO NOTHING) "
        "SELECT job_id, true, superseded_job_id, "
        "CAST(ceil(extract(epoch FROM window_ends_at) * 1000) AS bigint) FROM opened")


@dataclass(frozen=True, slots=True)
class KeyAnswer:
    """What taking a key found: the job that holds it now, and whether that is the one
    being enqueued (then its outbox row is written)."""

    holder: str
    sent: bool
    superseded: str | None = None  # debounce: the job of the window this one replaced
    not_before_ms: int | None = None  # debounce: the window's end

    @classmethod
    def of(cls, row: tuple[Any, ...] | None, job_id: str) -> KeyAnswer:
        if row is None:  # RETURNING always gives the row: this is a bug, not a state
            raise RuntimeError("taking a unique key returned no row")
        holder, taken_here, superseded, not_before_ms = row
        return cls(str(holder), bool(taken_here) and holder == job_id,
                   None if superseded is None else str(superseded),
                   None if not_before_ms is None else int(not_before_ms))

    def enqueued(self) -> Enqueued:
        """The answer as `enqueue` returns it."""
        return Enqueued(self.holder, sent=self.sent, superseded=self.superseded,
                        not_before_ms=self.not_before_ms)


def _statement(claim: KeyClaim, schema: str) -> Callable[[Placeholders], str]:
    template = (_unique_template if claim.kind == "unique" else _debounce_template)(schema)
    return lambda style: spell(template, style, _NAMES)


def _args(claim: KeyClaim, job_type: str, job_id: str) -> tuple[Any, ...]:
    return (job_type, claim.key, job_id, claim.window_s)


# The job's record once the key's answer is known (a debounced job's not-before is the
# window's end): (topic, record).
Build = Callable[[KeyAnswer], tuple[str, JobRecord]]


@runtime_checkable
class KeyStandIn(Protocol):
    """A transaction without a database (`stream_jobs.testing`'s) that takes keys itself,
    and gives them back if it rolls back."""

    def take_key(self, claim: KeyClaim, job_type: str, job_id: str) -> KeyAnswer: ...


def _taken_by_stand_in(conn: Any, claim: KeyClaim, job_type: str,
                       job_id: str) -> KeyAnswer | None:
    # Only objects of our own package are asked: a real driver's never pays the check.
    if type(conn).__module__.startswith("stream_jobs.") and isinstance(conn, KeyStandIn):
        return conn.take_key(claim, job_type, job_id)
    return None


async def enqueue_keyed_async(conn: Any, claim: KeyClaim, job_type: str, job_id: str,
                              schema: str, build: Build) -> KeyAnswer:
    """Take the key and, if this job got it, write its outbox row: through an async
    connection of the caller's, in its transaction."""
    answer = _taken_by_stand_in(conn, claim, job_type, job_id)
    if answer is None:
        row = await run_async(conn, _statement(claim, schema), _args(claim, job_type, job_id),
                              _NAMES, schema, fetch=True)
        answer = KeyAnswer.of(row, job_id)
    if answer.sent:
        await write_async(conn, [build(answer)], schema)
    return answer


def enqueue_keyed_sync(conn: Any, claim: KeyClaim, job_type: str, job_id: str, schema: str,
                       build: Build) -> KeyAnswer:
    """`enqueue_keyed_async` through a sync connection of the caller's."""
    answer = _taken_by_stand_in(conn, claim, job_type, job_id)
    if answer is None:
        row = run_sync(conn, _statement(claim, schema), _args(claim, job_type, job_id),
                       _NAMES, schema, fetch=True)
        answer = KeyAnswer.of(row, job_id)
    if answer.sent:
        write_sync(conn, [build(answer)], schema)
    return answer


async def enqueue_keyed_own(pool: LazyPool, claim: KeyClaim, job_type: str, job_id: str,
                            schema: str, build: Build) -> KeyAnswer:
    """The same in a transaction of its own, committed before this returns."""
    try:
        db = await pool.get()
        async with db.acquire() as conn, conn.transaction():
            return await enqueue_keyed_async(conn, claim, job_type, job_id, schema, build)
    except DRIVER_ERRORS as exc:
        raise database_error(exc, pool, f"take the {claim.kind} key") from exc


__all__ = ["Build", "KeyAnswer", "KeyStandIn", "enqueue_keyed_async", "enqueue_keyed_own",
           "enqueue_keyed_sync"]
