"""The history's windows in Postgres (`stream_jobs_history`), where every reader finds
them: `stats --history`, the gateway's route, charts and metrics.

The history process writes each window's whole tally as its exactly-once tables hold it
(an upsert that sets, so writing a window twice leaves it right), and only tallies its
transactions committed (it reads its own output topic read-committed). Readers read a
span of one type's windows in one query. Old windows are deleted here too, past the
7 days of minute windows and the 90 of hour windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from stream_jobs.clock import now_ms
from stream_jobs.errors import ConfigError, StreamJobsError
from stream_jobs.history.tally import Tally
from stream_jobs.history.windows import Windows
from stream_jobs.postgres.pool import DRIVER_ERRORS, MISSING_TABLE, LazyPool, database_error
from stream_jobs.settings import Settings

TOTAL_SIZE_S = 0  # the row of a type's running total: size 0, start 0

_UPSERT = """
INSERT INTO stream_jobs_history (job_type, size_s, start_ms, tally, updated_at)
VALUES ($1, $2, $3, $4::jsonb, now())
ON CONFLICT (job_type, size_s, start_ms)
DO UPDATE SET tally = excluded.tally, updated_at = excluded.updated_at
"""
_SPAN = """
SELECT start_ms, tally::text FROM stream_jobs_history
WHERE job_type = $1 AND size_s = $2 AND start_ms >= $3 ORDER BY start_ms
"""
_TOTALS = """
SELECT job_type, tally::text FROM stream_jobs_history WHERE size_s = 0 AND start_ms = 0
ORDER BY job_type
"""
_PRUNE = "DELETE FROM stream_jobs_history WHERE size_s = $1 AND start_ms < $2"


@dataclass(frozen=True)
class WindowRow:
    """One window of one type: its start (Unix ms), length and tally."""

    job_type: str
    size_s: int
    start_ms: int
    tally: Tally


class HistoryStore:
    """Reads and writes `stream_jobs_history` through a small pool of its own."""

    def __init__(self, settings: Settings, *, pool: LazyPool | None = None) -> None:
        self.settings = settings
        self.pool = pool or LazyPool(settings, max_size=2, name="stream-jobs-history")

    async def close(self) -> None:
        await self.pool.close()

    def _failed(self, exc: BaseException, what: str) -> StreamJobsError:
        if isinstance(exc, MISSING_TABLE):
            return ConfigError(
                f"Cannot {what}: schema {self.settings.database_schema!r} has no "
                "stream_jobs_history table; run `stream-jobs db migrate`.")
        return database_error(exc, self.pool, what)

    async def put(self, rows: Sequence[WindowRow]) -> None:
        """Set these windows' tallies (the history process's sink)."""
        try:
            pool = await self.pool.get()
            await pool.executemany(_UPSERT, [
                (row.job_type, row.size_s, row.start_ms, orjson.dumps(row.tally.to_obj()).decode())
                for row in rows])
        except DRIVER_ERRORS as exc:
            raise self._failed(exc, "write the history") from exc

    async def span(self, job_type: str, size_s: int, since_ms: int) -> list[WindowRow]:
        """One type's windows of `size_s` that start at or after `since_ms`, oldest first."""
        try:
            pool = await self.pool.get()
            found = await pool.fetch(_SPAN, job_type, size_s, since_ms)
        except DRIVER_ERRORS as exc:
            raise self._failed(exc, "read the history") from exc
        return [WindowRow(job_type, size_s, int(r[0]), Tally.from_obj(orjson.loads(r[1])))
                for r in found]

    async def totals(self) -> dict[str, Tally]:
        """Each type's running total since history began (what Prometheus counts)."""
        try:
            pool = await self.pool.get()
            found = await pool.fetch(_TOTALS)
        except DRIVER_ERRORS as exc:
            raise self._failed(exc, "read the history") from exc
        return {str(r[0]): Tally.from_obj(orjson.loads(r[1])) for r in found}

    async def prune(self, windows: Windows, *, at_ms: int | None = None) -> int:
        """Delete windows older than they are kept; how many went."""
        at = now_ms() if at_ms is None else at_ms
        gone = 0
        try:
            pool = await self.pool.get()
            for size_s, kept_s in windows.sizes():
                status = await pool.execute(_PRUNE, size_s, at - kept_s * 1000)
                gone += int(str(status).split()[-1])
        except DRIVER_ERRORS as exc:
            raise self._failed(exc, "prune the history") from exc
        return gone


__all__ = ["TOTAL_SIZE_S", "HistoryStore", "WindowRow"]
