"""`stream-jobs db migrate`: the settings' schema and, in it, every table, index and
sequence of `stream_jobs.postgres.schema` that is missing; and an app's own DDL after it
(`prepare_schema`, for the demo, the chaos runner and test fixtures).

Idempotent, in one transaction, one migration of a schema at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from stream_jobs.errors import ConfigError, DatabaseUnavailable, StreamJobsError
from stream_jobs.postgres.pool import DRIVER_ERRORS, REFUSED, UNREACHABLE, connect, not_connected
from stream_jobs.redaction import redact_text
from stream_jobs.settings import Settings

_NOT_CONNECTED: tuple[type[BaseException], ...] = (*DRIVER_ERRORS, TimeoutError)


@dataclass(frozen=True)
class Migration:
    """What a migration did: the schema it readied, whether it created it, and the
    tables and sequences of `stream_jobs.postgres.schema` it created or found there."""

    schema: str
    schema_created: bool
    created: tuple[str, ...]
    present: tuple[str, ...]


async def migrate(settings: Settings) -> Migration:
    """Create the settings' schema if it is missing, then in it every table, index and
    sequence of `stream_jobs.postgres.schema` that is missing (idempotent). All of it in
    one transaction, one migration of a schema at a time.

    Raises `ConfigError` when the user may not create the schema or its tables (with the
    statement that would grant it), `DatabaseUnavailable` when Postgres does not answer
    or refuses the URL or a statement.
    """
    from stream_jobs.postgres.schema import SCHEMA_OBJECTS, schema_ddl  # SQLAlchemy: only here

    schema = settings.database_schema
    try:
        conn = await connect(settings)
    except _NOT_CONNECTED as exc:
        raise not_connected(settings, exc) from exc
    try:
        async with conn.transaction():
            # One migration of a schema at a time: concurrent CREATE ... IF NOT EXISTS of
            # one name can both try, and one fails on a catalog's unique index.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _migration_lock(schema))
            user, database = await conn.fetchrow("SELECT current_user, current_database()")
            made = await _create_schema(conn, schema, user, database)
            there = {row[0] for row in await conn.fetch(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = ANY($2)",
                schema, list(SCHEMA_OBJECTS))}
            try:
                for statement in schema_ddl():
                    await conn.execute(statement)
            except asyncpg.InsufficientPrivilegeError as exc:
                raise ConfigError(
                    f"User {user!r} may not create tables in schema {schema!r} "
                    f"(STREAM_JOBS_DATABASE_SCHEMA): have its owner run `GRANT CREATE ON "
                    f"SCHEMA {schema} TO {user}`, or set STREAM_JOBS_DATABASE_SCHEMA to a "
                    "schema of the user's own.") from exc
    except DRIVER_ERRORS as exc:
        raise _failed(settings, exc, f"migrate schema {schema!r}") from exc
    finally:
        await conn.close()
    return Migration(schema, made,
                     created=tuple(o for o in SCHEMA_OBJECTS if o not in there),
                     present=tuple(o for o in SCHEMA_OBJECTS if o in there))


async def prepare_schema(settings: Settings, app_sql: Sequence[str] = ()) -> Migration:
    """Migrate the settings' schema (creating it if missing), then run an app's own DDL
    in it (the demo, the chaos runner and the test fixtures set up their databases so)."""
    migration = await migrate(settings)
    if not app_sql:
        return migration
    try:
        conn = await connect(settings)
    except DRIVER_ERRORS as exc:
        raise not_connected(settings, exc) from exc
    try:
        for statement in app_sql:
            try:
                await conn.execute(statement)
            except DRIVER_ERRORS as exc:
                detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise DatabaseUnavailable(
                    f"Postgres refused the app's statement {statement.split('(')[0].strip()!r} "
                    f"in schema {settings.database_schema!r}: {detail}") from exc
    finally:
        await conn.close()
    return migration


def _migration_lock(schema: str) -> int:
    """The advisory lock a migration of `schema` holds (advisory locks are database-wide)."""
    digest = hashlib.sha256(f"stream-jobs migrate\0{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def _create_schema(conn: Any, schema: str, user: str, database: str) -> bool:
    """Create `schema` if it does not exist; whether this call created it."""
    # Asked first: CREATE SCHEMA IF NOT EXISTS needs the privilege to create a schema
    # even when the schema is there.
    if await conn.fetchval("SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)",
                           schema):
        return False
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    except asyncpg.InsufficientPrivilegeError as exc:
        raise ConfigError(
            f"Schema {schema!r} (STREAM_JOBS_DATABASE_SCHEMA) does not exist and user "
            f"{user!r} may not create schemas in database {database!r}: have its owner run "
            f"`CREATE SCHEMA {schema} AUTHORIZATION {user}`, or set "
            "STREAM_JOBS_DATABASE_SCHEMA to a schema that exists.") from exc
    return True


def _failed(settings: Settings, exc: BaseException, what: str) -> StreamJobsError:
    """Our error for a driver error met while doing `what`."""
    if isinstance(exc, UNREACHABLE + REFUSED):
        return not_connected(settings, exc)
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
    return DatabaseUnavailable(redact_text(f"Postgres failed to {what}: {detail}.", settings))


__all__ = ["Migration", "migrate", "prepare_schema"]
