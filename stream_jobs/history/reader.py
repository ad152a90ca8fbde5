"""One type's history over a span, read from Postgres for `stats --history`, the
gateway's route and the dashboard's charts."""

from __future__ import annotations

from stream_jobs.clock import now_ms
from stream_jobs.history.store import HistoryStore
from stream_jobs.history.view import HistoryView, span_bounds
from stream_jobs.history.windows import Windows


async def read_view(store: HistoryStore, job_type: str, window: str, *,
                    at_ms: int | None = None) -> HistoryView:
    """The view of `job_type`'s span `window` ("1h", "24h", "7d") up to `at_ms` (now);
    ValueError for another window, ConfigError without the history table,
    DatabaseUnavailable when Postgres does not answer."""
    windows = Windows(store.settings.history_window_s)
    at = now_ms() if at_ms is None else at_ms
    size_s, since_ms = span_bounds(windows, window, at)
    found = await store.span(job_type, size_s, since_ms)
    return HistoryView.of(job_type, window, windows, found, now_ms=at)


__all__ = ["read_view"]
