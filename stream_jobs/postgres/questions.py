"""One question to Postgres on a connection of its own, for the tools that read state.

`stream-jobs stats`, `outbox status`, `batch` and the gateway ask a few rows at a time and
must not hang on a database that does not answer (Kafka's figures still show), so each
question opens a short connection with a connect timeout. The errors a user can act on are
told apart here, once: Postgres away (`DatabaseUnavailable`) and tables not migrated yet
(`ConfigError`, naming the command that creates them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from stream_jobs.errors import ConfigError, DatabaseUnavailable
from stream_jobs.postgres.pool import not_connected
from stream_jobs.redaction import redact_text
from stream_jobs.settings import Settings

CONNECT_TIMEOUT_S = 3.0

T = TypeVar("T")


async def ask(settings: Settings, query: Callable[[asyncpg.Connection], Awaitable[T]], *,
              missing: str, about: str) -> T:
    """`query(conn)` on a fresh connection. `missing` says what an unmigrated schema lacks
    ("There is no outbox table"), `about` what the question is about ("the outbox")."""
    try:
        conn = await asyncpg.connect(settings.database_url, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise not_connected(settings, exc) from exc
    try:
        return await query(conn)
    except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError) as exc:
        raise ConfigError(f"{missing} in schema {settings.database_schema!r}: "
                          "run `stream-jobs db migrate`.") from exc
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise DatabaseUnavailable(redact_text(f"Postgres failed a question about {about}: "
                                              f"{exc}", settings)) from exc
    finally:
        await conn.close()


__all__ = ["CONNECT_TIMEOUT_S", "ask"]
