"""A test app's own bookkeeping rows: a pool opened on first use, outside any dedup
transaction, that does not wait for the WAL flush (a killed worker process loses nothing
it already sent; only a Postgres crash could)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from stream_jobs.app import App


class BookkeepingPool:
    def __init__(self, app: App) -> None:
        self._app = app
        self._pool: Any = None
        self._lock = asyncio.Lock()

    async def get(self) -> Any:
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                settings = self._app.settings
                self._pool = await asyncpg.create_pool(
                    settings.database_url, min_size=1, max_size=8,
                    server_settings={"search_path": settings.database_schema,
                                     "synchronous_commit": "off"})
        return self._pool
