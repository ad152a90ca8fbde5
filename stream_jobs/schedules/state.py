"""The schedules' state in Postgres (`stream_jobs_schedules`): what each leader handled,
what it fired last, and what operators paused.

A row per (prefix, type, schedule). `horizon_ms` only grows: every fire time up to it was
enqueued or left out by the missed policy. The leader reads a row `FOR UPDATE`, enqueues
the due firings, then moves the horizon in the same transaction, so `pause` (which
updates the row) waits for a firing in progress and no firing starts after it returns.
A leader that dies between the enqueue and the commit leaves the horizon where it was:
the next leader enqueues those firings again under the same job IDs, and the dedup table
runs them once.

Times in the table are Unix ms of the schedulers' clocks; `resume` uses the database's.
SQLAlchemy owns the table (`stream_jobs.postgres.schema`, created by `stream-jobs db migrate`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from stream_jobs.errors import ConfigError, DatabaseUnavailable
from stream_jobs.periodic import ScheduleSpec
from stream_jobs.redaction import redact_text, redact_url
from stream_jobs.schedules.firings import Due
from stream_jobs.schedules.timing import next_fire_ms
from stream_jobs.settings import Settings

# Postgres went away under us: down, restarting, our session ended (by a timeout of its
# own, see `leader`), or the network between.
UNREACHABLE: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
    asyncpg.exceptions.IdleSessionTimeoutError, asyncpg.TooManyConnectionsError)

_COLUMNS = ("job_type, name, spec, paused, horizon_ms, next_fire_ms, last_fired_ms, "
            "last_job_id, last_enqueued_at, missed_total, updated_at")


@dataclass(frozen=True)
class ScheduleState:
    """One schedule's row: what `stream-jobs schedules list` and the dashboard show."""

    job_type: str
    name: str
    spec: str
    paused: bool
    horizon_ms: int
    next_fire_ms: int | None
    last_fired_ms: int | None
    last_job_id: str | None
    last_enqueued_at: datetime | None
    missed_total: int
    updated_at: datetime


def unavailable(settings: Settings, exc: BaseException) -> DatabaseUnavailable:
    return DatabaseUnavailable(redact_text(
        f"Postgres did not answer at {redact_url(settings.database_url)} "
        f"(STREAM_JOBS_DATABASE_URL): {type(exc).__name__}: {exc}", settings))


def no_table(settings: Settings) -> ConfigError:
    return ConfigError(
        f"There is no schedules table in schema {settings.database_schema!r}: run "
        "`stream-jobs db migrate` first (or point STREAM_JOBS_DATABASE_SCHEMA at the schema "
        "that has it).")


async def connect(settings: Settings, *, application_name: str,
                  server_settings: dict[str, str] | None = None) -> Any:
    """A connection to the schema of `settings`, named in `pg_stat_activity`."""
    try:
        return await asyncpg.connect(
            settings.database_url, timeout=10,
            server_settings={"search_path": settings.database_schema,
                             "application_name": application_name[:63],
                             **(server_settings or {})})
    except (*UNREACHABLE, asyncpg.PostgresError) as exc:
        raise unavailable(settings, exc) from exc


@asynccontextmanager
async def guarded(settings: Settings) -> AsyncIterator[None]:
    """Driver errors inside become ours: no table is a ConfigError (run `db migrate`),
    anything else from Postgres or the connection is DatabaseUnavailable."""
    try:
        yield
    except asyncpg.UndefinedTableError as exc:
        raise no_table(settings) from exc
    except (*UNREACHABLE, asyncpg.PostgresError) as exc:
        raise unavailable(settings, exc) from exc


@asynccontextmanager
async def session(settings: Settings, application_name: str) -> AsyncIterator[Any]:
    """A short-lived connection for the CLI and the gateway; driver errors wrapped."""
    conn = await connect(settings, application_name=application_name)
    try:
        async with guarded(settings):
            yield conn
    finally:
        try:
            await conn.close(timeout=5)
        except UNREACHABLE:
            conn.terminate()


async def ensure(conn: Any, prefix: str, job_type: str, spec: ScheduleSpec,
                 now_ms: int) -> int:
    """Make the schedule's row exist (a new schedule starts from now: nothing is missed
    before it was declared) and keep its spec text current; its horizon."""
    row = await conn.fetchrow(
        "INSERT INTO stream_jobs_schedules (topic_prefix, job_type, name, spec, horizon_ms, "
        "next_fire_ms) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (topic_prefix, job_type, "
        "name) DO UPDATE SET spec = EXCLUDED.spec RETURNING horizon_ms",
        prefix, job_type, spec.name, spec.describe(), now_ms, next_fire_ms(spec, now_ms))
    horizon = int(row["horizon_ms"])
    await conn.execute(
        "UPDATE stream_jobs_schedules SET next_fire_ms = $4 WHERE topic_prefix = $1 AND "
        "job_type = $2 AND name = $3", prefix, job_type, spec.name, next_fire_ms(spec, horizon))
    return horizon


async def peek(conn: Any, prefix: str, job_type: str, name: str) -> tuple[bool, int] | None:
    """(paused, horizon_ms) without locking the row; None if there is no row."""
    row = await conn.fetchrow(
        "SELECT paused, horizon_ms FROM stream_jobs_schedules WHERE topic_prefix = $1 AND "
        "job_type = $2 AND name = $3", prefix, job_type, name)
    return None if row is None else (bool(row["paused"]), int(row["horizon_ms"]))


async def claim(conn: Any, prefix: str, job_type: str, name: str) -> tuple[bool, int] | None:
    """(paused, horizon_ms), the row locked until the caller's transaction ends; None if
    the row is gone (`ensure` it again)."""
    row = await conn.fetchrow(
        "SELECT paused, horizon_ms FROM stream_jobs_schedules WHERE topic_prefix = $1 AND "
        "job_type = $2 AND name = $3 FOR UPDATE", prefix, job_type, name)
    return None if row is None else (bool(row["paused"]), int(row["horizon_ms"]))


async def record(conn: Any, prefix: str, job_type: str, spec: ScheduleSpec, due: Due,
                 job_ids: Sequence[str]) -> None:
    """After `due`'s firings were enqueued (as `job_ids`): move the horizon and note the
    newest firing. Only ever forward, so a late writer (a leader that was paused while
    another took over) cannot move the row back."""
    fired = due.fire_ms[-1] if due.fire_ms else None
    await conn.execute(
        "UPDATE stream_jobs_schedules SET horizon_ms = GREATEST(horizon_ms, $4), "
        "next_fire_ms = $5, missed_total = missed_total + $6, updated_at = now(), "
        "last_job_id = CASE WHEN $7::bigint >= COALESCE(last_fired_ms, -1) THEN $8 "
        "ELSE last_job_id END, "
        "last_enqueued_at = CASE WHEN $7::bigint IS NULL THEN last_enqueued_at ELSE now() END, "
        "last_fired_ms = GREATEST(last_fired_ms, $7) "
        "WHERE topic_prefix = $1 AND job_type = $2 AND name = $3",
        prefix, job_type, spec.name, due.horizon_ms, next_fire_ms(spec, due.horizon_ms),
        due.dropped, fired, job_ids[-1] if job_ids else None)


async def set_paused(settings: Settings, prefix: str, job_type: str, name: str,
                     paused: bool) -> bool:
    """Pause or resume a schedule; False if no scheduler has run it yet (no row).

    Resuming moves the horizon to now (the database's clock): firings that fell due
    while it was paused are not caught up. Waits for a firing in progress to commit.
    """
    async with session(settings, "stream-jobs schedules") as conn:
        status = await conn.execute(
            "UPDATE stream_jobs_schedules SET paused = $4, updated_at = now(), horizon_ms = "
            "CASE WHEN $4 THEN horizon_ms ELSE GREATEST(horizon_ms, "
            "(extract(epoch FROM clock_timestamp()) * 1000)::bigint) END "
            "WHERE topic_prefix = $1 AND job_type = $2 AND name = $3",
            prefix, job_type, name, paused)
    return bool(status.endswith(" 1"))


async def declare_paused(settings: Settings, prefix: str, job_type: str, spec: ScheduleSpec,
                         now_ms: int) -> None:
    """Pause a schedule no scheduler has run yet: its row is made, paused."""
    async with session(settings, "stream-jobs schedules") as conn:
        await conn.execute(
            "INSERT INTO stream_jobs_schedules (topic_prefix, job_type, name, spec, "
            "horizon_ms, next_fire_ms, paused) VALUES ($1, $2, $3, $4, $5, $6, true) "
            "ON CONFLICT (topic_prefix, job_type, name) DO UPDATE SET paused = true",
            prefix, job_type, spec.name, spec.describe(), now_ms, next_fire_ms(spec, now_ms))


async def read_states(settings: Settings, prefix: str) -> list[ScheduleState]:
    """Every schedule row of the deployment (prefix), by type and name."""
    async with session(settings, "stream-jobs schedules") as conn:
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM stream_jobs_schedules WHERE topic_prefix = $1 "
            "ORDER BY job_type, name", prefix)
    return [ScheduleState(**dict(row)) for row in rows]
