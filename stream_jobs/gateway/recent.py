"""The last hour of every type's history, and the running totals, read from Postgres at
the stats sampler's pace for the dashboard's charts and `/metrics`.

The history process keeps the windows (docs/history.md); the gateway only reads them, so
a restarted gateway draws the same last hour as before. What a page or a scrape shows is
at most one `interval_s` old, and neither waits on Postgres.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from stream_jobs.errors import StreamJobsError
from stream_jobs.history.reader import read_view
from stream_jobs.history.store import HistoryStore
from stream_jobs.history.tally import Tally
from stream_jobs.history.view import HistoryView
from stream_jobs.redaction import redact_text
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.gateway")

CHART_WINDOW = "1h"


class RecentHistory:
    """`views` (each type's last hour), `totals` (None until read) and `problem` (why the
    last reading failed, if it did), refreshed by `run`."""

    def __init__(self, settings: Settings, types: Iterable[str], *, interval_s: float,
                 store: HistoryStore | None = None) -> None:
        self.settings = settings
        self.types = sorted(types)
        self.interval_s = interval_s
        self.store = store or HistoryStore(settings)
        self.views: dict[str, HistoryView] = {}
        self.totals: dict[str, Tally] | None = None
        self.problem: str | None = None
        self.read = asyncio.Event()  # set after the first reading, good or bad

    async def refresh(self) -> None:
        """Read the totals and each type's last hour (one query each)."""
        try:
            totals = await self.store.totals()
            views = {t: await read_view(self.store, t, CHART_WINDOW) for t in self.types}
        except StreamJobsError as exc:
            self.problem = redact_text(str(exc), self.settings)
            log.warning("history not read: %s", self.problem)
        except Exception as exc:  # a driver error we do not wrap must not end the reading
            # Shown on the overview page: a driver's message may quote the database URL.
            self.problem = redact_text(f"{type(exc).__name__}: {exc}", self.settings)
            log.error("history not read: %s", self.problem)
        else:
            self.problem, self.totals, self.views = None, totals, views
        self.read.set()

    async def run(self) -> None:
        """Refresh until cancelled, on a fixed schedule."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            await self.refresh()
            due = max(due + self.interval_s, loop.time())
            await asyncio.sleep(due - loop.time())  # a period, not a wait for a condition

    async def close(self) -> None:
        await self.store.close()


__all__ = ["CHART_WINDOW", "RecentHistory"]
