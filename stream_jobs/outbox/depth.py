"""How much waits in the outbox: rows, the age of the oldest, rows whose write failed.

What `stream-jobs stats`, `stream-jobs outbox status` and the gateway's gauges show. A
row normally lives for milliseconds (commit, NOTIFY, a relay's round); an old oldest row
means no relay runs, or Kafka refuses what the rows are for (`last_error` says why).
`OutboxWaiting` asks the one question `stream-jobs worker --until-idle` needs: do rows
for these topics wait?
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from stream_jobs.errors import BadRecord, DatabaseUnavailable
from stream_jobs.outbox.rows import decode_headers, table
from stream_jobs.postgres.questions import CONNECT_TIMEOUT_S, ask
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.redaction import redact_text, redact_url
from stream_jobs.settings import Settings

# What `ask` says when the tables are missing or Postgres fails.
_ABOUT = {"missing": "There is no outbox table", "about": "the outbox"}


@dataclass(frozen=True)
class OutboxDepth:
    """The outbox of one schema at one moment (the database's clock)."""

    schema: str
    depth: int
    oldest_age_s: float | None  # None when empty
    retrying: int  # rows a relay failed to write at least once, waiting for their retry

    def to_dict(self) -> dict[str, Any]:
        age = None if self.oldest_age_s is None else round(self.oldest_age_s, 3)
        return {"schema": self.schema, "depth": self.depth, "oldest_age_s": age,
                "retrying": self.retrying}


@dataclass(frozen=True)
class FailingRow:
    """A row whose write to Kafka failed: what `outbox status` lists."""

    id: int
    topic: str
    job_id: str | None
    attempts: int
    created_at: datetime
    retry_at: datetime | None
    last_error: str | None


def _depth_sql(schema: str) -> str:
    t = table(schema)
    # The smallest id is the row written first; the primary key finds it at once.
    return (f"SELECT (SELECT count(*) FROM {t}) AS depth, "
            f"(SELECT extract(epoch FROM clock_timestamp() - created_at) FROM {t} "
            "ORDER BY id LIMIT 1)::float8 AS oldest_age_s, "
            f"(SELECT count(*) FROM {t} WHERE attempts > 0) AS retrying")


async def read_depth(settings: Settings) -> OutboxDepth:
    """The outbox of the settings' schema. `DatabaseUnavailable` if Postgres does not
    answer, `ConfigError` if the schema has no outbox table."""
    row = await ask(settings, lambda conn: conn.fetchrow(_depth_sql(settings.database_schema)),
                    **_ABOUT)
    return OutboxDepth(settings.database_schema, int(row["depth"]), row["oldest_age_s"],
                       int(row["retrying"]))


async def depth_by_topic(settings: Settings, limit: int = 50) -> list[tuple[str, int, float]]:
    """(topic, rows, age of its oldest row in s) of the `limit` topics with most rows."""
    sql = (f"SELECT topic, count(*) AS n, extract(epoch FROM clock_timestamp() - "
           f"min(created_at))::float8 AS age FROM {table(settings.database_schema)} "
           "GROUP BY topic ORDER BY n DESC, topic LIMIT $1")
    found = await ask(settings, lambda conn: conn.fetch(sql, limit), **_ABOUT)
    return [(r["topic"], int(r["n"]), float(r["age"])) for r in found]


async def failing_rows(settings: Settings, limit: int = 20) -> list[FailingRow]:
    """Rows whose write failed, oldest first."""
    sql = (f"SELECT id, topic, headers, attempts, created_at, retry_at, last_error "
           f"FROM {table(settings.database_schema)} WHERE attempts > 0 ORDER BY id LIMIT $1")
    found = await ask(settings, lambda conn: conn.fetch(sql, limit), **_ABOUT)
    return [FailingRow(r["id"], r["topic"], _job_id(r["headers"]), r["attempts"],
                       r["created_at"], r["retry_at"], r["last_error"]) for r in found]


def _job_id(headers: str) -> str | None:
    try:
        pairs = decode_headers(headers)
    except BadRecord:  # a row another program wrote: it has no job ID to show
        return None
    for name, value in pairs:
        if name == HEADER_JOB_ID:
            return value.decode()
    return None


class OutboxWaiting:
    """Rows of the outbox whose topic is one of `topics` (a worker's lanes and delay
    tiers), asked again and again on one connection of its own (opened on first use,
    opened again after a failure). A schema without an outbox table has none waiting."""

    def __init__(self, settings: Settings, topics: Iterable[str]) -> None:
        self.settings = settings
        self.topics = sorted(set(topics))
        self._sql = (f"SELECT count(*) FROM {table(settings.database_schema)} "
                     "WHERE topic = ANY($1::text[])")
        self._conn: Any = None

    async def rows(self) -> int:
        """Rows waiting for those topics now. `DatabaseUnavailable` if Postgres fails."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self.settings.database_url,
                                                   timeout=CONNECT_TIMEOUT_S)
            return int(await self._conn.fetchval(self._sql, self.topics))
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return 0  # never migrated: nothing was ever written to it
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.close()
            raise DatabaseUnavailable(redact_text(
                f"Postgres did not answer about the outbox at "
                f"{redact_url(self.settings.database_url)}: {exc}", self.settings)) from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):  # a broken connection: nothing to keep
                await conn.close(timeout=5)


__all__ = ["FailingRow", "OutboxDepth", "OutboxWaiting", "depth_by_topic", "failing_rows",
           "read_depth"]
