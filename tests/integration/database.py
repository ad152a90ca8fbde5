"""The test's own Postgres schema, for reading what handlers wrote: one place for the
connection the integration tests open beside the code under test."""

from __future__ import annotations

from typing import Any

import asyncpg

from stream_jobs.settings import Settings


async def connect(settings: Settings) -> asyncpg.Connection:
    """A connection whose `search_path` is the test's schema (the caller closes it)."""
    return await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})


async def fetch_rows(settings: Settings, statement: str, *args: object) -> list[asyncpg.Record]:
    """`statement`'s rows, on a connection of its own."""
    conn = await connect(settings)
    try:
        return list(await conn.fetch(statement, *args))
    finally:
        await conn.close()


async def fetch_value(settings: Settings, statement: str, *args: object) -> Any:
    """`statement`'s first column of its first row, on a connection of its own."""
    conn = await connect(settings)
    try:
        return await conn.fetchval(statement, *args)
    finally:
        await conn.close()
