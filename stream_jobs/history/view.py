"""What readers show of a span of history: rows of jobs by outcome, failure ratio,
throughput and percentiles, grouped for a table, and the span's totals. Pure.

`stats TYPE --history`, `GET /types/{type}/history` and the dashboard's charts read the
same `HistoryView`: the windows of one type over a span ("1h" in minute windows, "24h"
and "7d" in hour windows), oldest first. A window still open (it ends after `now`) is
marked so, and its throughput is over the time it has been open, not its whole length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from stream_jobs.history.tally import Tally, total
from stream_jobs.history.windows import SPANS, Windows, window_start

DURATION_QUANTILES = (0.5, 0.95, 0.99)
DWELL_QUANTILES = (0.5, 0.95)
# The table's rows: minute windows by fives over an hour, hour windows by day over a week.
TABLE_GROUPS = {"1h": 5, "24h": 1, "7d": 24}
NO_HISTORY = ("the history process keeps it: start `stream-jobs history` (or "
              "`stream-jobs serve --history`) next to the workers")


class Window(Protocol):
    """A window as `HistoryStore.span` reads it (`WindowRow`)."""

    @property
    def start_ms(self) -> int: ...

    @property
    def tally(self) -> Tally: ...


def span_name(name: str) -> str:
    """`name` when it is a span readers accept ("1h", "24h", "7d"); ValueError if not."""
    if name not in SPANS:
        raise ValueError(f"unknown history window {name!r}: use one of {', '.join(SPANS)}")
    return name


def span_bounds(windows: Windows, name: str, now_ms: int) -> tuple[int, int]:
    """(window size in s, start in ms of the span's oldest window): the span's windows
    end with the one `now_ms` falls in, so "1h" is the 60 minute windows up to now."""
    size_s, span_s = windows.span(span_name(name))
    newest = window_start(now_ms, size_s)
    return size_s, newest - span_s * 1000 + size_s * 1000


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _quantiles(tally: Tally, durations: bool, qs: Sequence[float]) -> dict[str, float | None]:
    read = tally.duration_s if durations else tally.dwell_s
    return {f"p{round(q * 100)}": read(q) for q in qs}


@dataclass(frozen=True)
class HistoryRow:
    """One window, or several added together: `size_s` from `start_ms`, of which
    `covered_s` had passed at `now` (less than `size_s` while the last one is open)."""

    start_ms: int
    size_s: int
    covered_s: float
    tally: Tally

    @property
    def open(self) -> bool:
        return self.covered_s < self.size_s

    @property
    def failure_ratio(self) -> float | None:
        """Failed attempts (retried, dead-lettered) of all finished; None when none."""
        finished = self.tally.finished
        return self.tally.failed / finished if finished else None

    @property
    def per_min(self) -> float:
        """Jobs finished per minute over the time the row covers."""
        return self.tally.finished * 60 / self.covered_s if self.covered_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"start": _iso(self.start_ms), "start_ms": self.start_ms,
                "size_s": self.size_s, "open": self.open,
                "outcomes": dict(sorted(self.tally.outcomes.items())),
                "finished": self.tally.finished, "failed": self.tally.failed,
                "failure_ratio": self.failure_ratio, "per_min": self.per_min,
                "duration_s": _quantiles(self.tally, True, DURATION_QUANTILES),
                "dwell_s": _quantiles(self.tally, False, DWELL_QUANTILES)}


@dataclass(frozen=True)
class HistoryView:
    """One type's windows over a span, oldest first, and their total."""

    job_type: str
    window: str  # the span's name: 1h, 24h or 7d
    size_s: int  # each window's length
    span_s: int
    since_ms: int  # the start of the span's oldest window
    now_ms: int
    rows: tuple[HistoryRow, ...]

    @classmethod
    def of(cls, job_type: str, name: str, windows: Windows, found: Sequence[Window],
           *, now_ms: int) -> HistoryView:
        """The view of what `HistoryStore.span` found for the span `name` at `now_ms`
        (windows older than the span are left out)."""
        size_s, since_ms = span_bounds(windows, name, now_ms)
        rows = tuple(HistoryRow(w.start_ms, size_s, _covered(w.start_ms, size_s, now_ms),
                                w.tally)
                     for w in sorted(found, key=lambda w: w.start_ms) if w.start_ms >= since_ms)
        return cls(job_type, name, size_s, windows.span(name)[1], since_ms, now_ms, rows)

    @property
    def empty(self) -> bool:
        return not any(row.tally.finished for row in self.rows)

    def totals(self) -> HistoryRow:
        """The span's rows added up; its throughput is over the span up to now."""
        return HistoryRow(self.since_ms, self.span_s,
                          _covered(self.since_ms, self.span_s, self.now_ms),
                          total([row.tally for row in self.rows]))

    def grouped(self, windows_per_row: int) -> list[HistoryRow]:
        """Rows of `windows_per_row` windows each, aligned to multiples of their length
        (5 minutes, a day), oldest first; a group without windows is left out."""
        if windows_per_row < 1:
            raise ValueError("a row holds at least one window")
        size_s = self.size_s * windows_per_row
        groups: dict[int, list[HistoryRow]] = {}
        for row in self.rows:
            groups.setdefault(window_start(row.start_ms, size_s), []).append(row)
        return [HistoryRow(start, size_s, _covered(start, size_s, self.now_ms),
                           total([r.tally for r in rows]))
                for start, rows in sorted(groups.items())]

    def table_rows(self) -> list[HistoryRow]:
        """The rows `stats --history` shows: 5-minute rows for 1h, hours for 24h, days
        for 7d."""
        return self.grouped(TABLE_GROUPS[self.window])

    def outcome_names(self) -> list[str]:
        """Every outcome the span holds: succeeded, retried and dead_lettered first."""
        seen = {name for row in self.rows for name in row.tally.outcomes}
        first = ["succeeded", "retried", "dead_lettered"]
        return first + sorted(seen - set(first))

    def note(self) -> str | None:
        """What to say when the span holds no finished job."""
        if not self.empty:
            return None
        return (f"No history of {self.job_type} in the last {self.window}: either no job "
                f"finished, or nothing records them; {NO_HISTORY}.")

    def to_dict(self) -> dict[str, Any]:
        """What `stats TYPE --history W --json` prints and the gateway's route answers."""
        return {"job_type": self.job_type, "window": self.window, "size_s": self.size_s,
                "span_s": self.span_s, "note": self.note(),
                "totals": self.totals().to_dict(),
                "rows": [row.to_dict() for row in self.rows]}


def _covered(start_ms: int, size_s: int, now_ms: int) -> float:
    return float(min(size_s, max(0.0, (now_ms - start_ms) / 1000)))


__all__ = ["DURATION_QUANTILES", "DWELL_QUANTILES", "NO_HISTORY", "TABLE_GROUPS",
           "HistoryRow", "HistoryView", "Window", "span_bounds", "span_name"]
