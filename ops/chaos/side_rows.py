"""Rows a chaos app writes outside the exactly-once transaction, on a pool of its own
(opened at the first row): one per call, so a call made twice shows twice."""

from __future__ import annotations

import os

import asyncpg

from stream_jobs.app import App


class SideRows:
    """`await rows.record(job_id)` inserts `(job_id, pid)` into `table` of `app`'s schema."""

    def __init__(self, app: App, table: str) -> None:
        self._app = app
        self._insert = f"INSERT INTO {table} (job_id, pid) VALUES ($1, $2)"
        self._pool: asyncpg.Pool | None = None

    async def record(self, job_id: str) -> None:
        if self._pool is None:
            settings = self._app.settings
            self._pool = await asyncpg.create_pool(
                settings.database_url, min_size=0, max_size=2,
                server_settings={"search_path": settings.database_schema})
        await self._pool.execute(self._insert, job_id, os.getpid())


__all__ = ["SideRows"]
