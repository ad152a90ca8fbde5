"""A small asyncpg pool opened on first use, with the settings' schema as search_path and
driver errors turned into ours where they enter.

Cancels, unique keys and debounce windows each need a few connections to the dedup
database, and only when they are used: a client that never cancels, or a worker whose
jobs carry no unique key, never connects.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from stream_jobs.errors import ConfigError, DatabaseUnavailable, StreamJobsError
from stream_jobs.redaction import redact_text, redact_url
from stream_jobs.settings import Settings

# Opening a connection failed: Postgres is down, refusing, or still starting.
UNREACHABLE = (OSError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError)
# Postgres answered but would not let us in: the URL's database, user or password is wrong.
REFUSED = (asyncpg.InvalidCatalogNameError, asyncpg.InvalidAuthorizationSpecificationError,
           asyncpg.InvalidPasswordError)


class LazyPool:
    """`await pool.get()` opens it (raising `DatabaseUnavailable`); `close()` closes it."""

    def __init__(self, settings: Settings, *, max_size: int = 4, name: str = "stream-jobs"
                 ) -> None:
        self.settings = settings
        self._max_size = max_size
        self._name = name
        self._pool: asyncpg.Pool | None = None

    async def get(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                self._pool = await asyncpg.create_pool(
                    self.settings.database_url, min_size=0, max_size=self._max_size,
                    timeout=10, server_settings={
                        "search_path": self.settings.database_schema,
                        "application_name": self._name})
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise self.unavailable(exc) from exc
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    def unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        return not_connected(self.settings, exc)


def not_connected(settings: Settings, exc: BaseException) -> DatabaseUnavailable:
    """Our error for a connection to the settings' database that could not be opened:
    Postgres did not answer, or refused the URL's database, user or password."""
    shown = redact_url(settings.database_url)
    if isinstance(exc, REFUSED):
        return DatabaseUnavailable(
            f"The Postgres server at {shown} (STREAM_JOBS_DATABASE_URL) refused us "
            f"({_first_line(exc, settings)}): fix the user, password or database in the "
            "setting.")
    return DatabaseUnavailable(
        f"Postgres did not answer at {shown} (STREAM_JOBS_DATABASE_URL): "
        f"{_first_line(exc, settings)}; start it (`stream-jobs dev up` starts the local one) "
        "or fix the setting.")


def _first_line(exc: BaseException, settings: Settings) -> str:
    """The driver's message, which may quote the URL, with its secrets masked."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
    return redact_text(line, settings)


def database_error(exc: BaseException, pool: LazyPool, what: str) -> StreamJobsError:
    """Our error for a driver error met while doing `what` ("cancel the job")."""
    if isinstance(exc, StreamJobsError):
        return exc
    if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.InvalidSchemaNameError):
        return ConfigError(
            f"Cannot {what}: schema {pool.settings.database_schema!r} lacks the tables of "
            "cancels and unique keys; run `stream-jobs db migrate` (or point "
            "STREAM_JOBS_DATABASE_SCHEMA at the schema that has them).")
    if isinstance(exc, UNREACHABLE + REFUSED):
        return pool.unavailable(exc)
    return DatabaseUnavailable(f"Postgres failed to {what}: {_first_line(exc, pool.settings)}.")


# The driver's errors, for `except` clauses at this boundary. InternalClientError is what
# the pool's reset of a connection the server has just cut (a Postgres restart) can raise.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)
# The schema or a table of ours is not there: `stream-jobs db migrate` has not run on it.
MISSING_TABLE: tuple[type[BaseException], ...] = (
    asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError)


async def connect(settings: Settings, *, timeout_s: float = 10, in_schema: bool = True,
                  application_name: str | None = None) -> Any:
    """One connection of its own to the settings' database (the caller closes it), with
    the settings' schema as its search_path unless `in_schema` is False; driver errors
    as the driver raises them, for callers that tell them apart."""
    server_settings = {"search_path": settings.database_schema} if in_schema else {}
    if application_name is not None:
        server_settings["application_name"] = application_name
    return await asyncpg.connect(settings.database_url, timeout=timeout_s,
                                 server_settings=server_settings or None)


__all__ = ["DRIVER_ERRORS", "MISSING_TABLE", "REFUSED", "UNREACHABLE", "LazyPool", "connect",
           "database_error", "not_connected"]
