"""Time in history: a worker's slots, the history's windows, and the spans readers ask
for. Pure.

A worker counts per slot of `history_window_s` (60 s by default) and reports the slots of
the last few minutes, each cumulative within its slot (`SlotTallies`). The history process
keeps, per type, a tally per minute window (kept 7 days) and per hour window (60 minute
windows, kept 90 days); what a report adds is its slots minus what the same worker's
previous report said of them (`slot_deltas`), so a lost report costs nothing and a
report read twice adds nothing. A job is counted in the slot its end was recorded in:
once, in one window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stream_jobs.history.tally import Tally

# A worker keeps (and reports) this many slots: a report lost for up to this many slots
# is made good by the next one.
SLOTS_KEPT = 10

MINUTES_KEPT_S = 7 * 86400
HOURS_KEPT_S = 90 * 86400
MINUTES_PER_HOUR = 60

# What `stats --history` and `GET /types/{type}/history?window=` accept: the span read,
# and whether it is read in minute windows (else hour windows).
SPANS: dict[str, tuple[int, bool]] = {"1h": (3600, True), "24h": (86400, False),
                                      "7d": (7 * 86400, False)}


def window_start(at_ms: int, size_s: int) -> int:
    size_ms = size_s * 1000
    return at_ms // size_ms * size_ms


@dataclass(frozen=True)
class Windows:
    """The sizes of the history's windows: a minute window is `minute_s` (60 outside of
    tests), an hour window 60 of them."""

    minute_s: int = 60

    def __post_init__(self) -> None:
        if self.minute_s <= 0:
            raise ValueError("a history window lasts at least a second")

    @property
    def hour_s(self) -> int:
        return self.minute_s * MINUTES_PER_HOUR

    def sizes(self) -> tuple[tuple[int, int], ...]:
        """(window size, how long windows of that size are kept), both in seconds."""
        return ((self.minute_s, MINUTES_KEPT_S), (self.hour_s, HOURS_KEPT_S))

    def span(self, name: str) -> tuple[int, int]:
        """(size of the windows to read, how far back in seconds) for a span name."""
        if name not in SPANS:
            raise ValueError(f"unknown history window {name!r}: one of {', '.join(SPANS)}")
        span_s, in_minutes = SPANS[name]
        return (self.minute_s if in_minutes else self.hour_s), span_s


class SlotTallies:
    """A worker's tallies per slot. Outcome counts are read off the worker's cumulative
    counter (`totals`) at each slot's end, so every place that counts an outcome counts in
    its slot too; `tick` must come before a count and `observe` after it."""

    def __init__(self, totals: Counter[str], slot_s: int, *, kept: int = SLOTS_KEPT) -> None:
        self.totals = totals
        self.slot_ms = slot_s * 1000
        self.kept = kept
        self._closed: dict[int, Tally] = {}
        self._start = -1
        self._end = -1  # the first tick opens the first slot
        self._base: Counter[str] = Counter()
        self._open = Tally()

    def tick(self, now_ms: int) -> None:
        """Close the open slot if `now_ms` is past it (cheap when it is not)."""
        if now_ms >= self._end:
            self._roll(now_ms)

    def observe(self, duration_s: float, dwell_s: float) -> None:
        self._open.observe(duration_s, dwell_s)

    def _roll(self, now_ms: int) -> None:
        if self._start >= 0:
            self._open.outcomes = self._outcomes_since_base()
            if not self._open.empty:
                self._closed[self._start] = self._open
        self._base = Counter(self.totals)
        self._open = Tally()
        self._start = now_ms // self.slot_ms * self.slot_ms
        self._end = self._start + self.slot_ms
        oldest = self._start - self.kept * self.slot_ms
        for start in [s for s in self._closed if s < oldest]:
            del self._closed[start]

    def _outcomes_since_base(self) -> dict[str, int]:
        base = self._base
        return {str(k): n - base.get(k, 0) for k, n in self.totals.items() if n > base.get(k, 0)}

    def slots(self, now_ms: int) -> dict[int, Tally]:
        """The kept slots and the open one (its counts so far), by start in ms."""
        self.tick(now_ms)
        out = dict(self._closed)
        current = Tally(self._outcomes_since_base(), list(self._open.durations),
                        list(self._open.dwells))
        if not current.empty:
            out[self._start] = current
        return out


def slot_deltas(before: Mapping[int, Tally], after: Mapping[int, Tally]) -> list[tuple[int, Tally]]:
    """What a worker's report (`after`) adds to its previous one (`before`), per slot start,
    oldest first; slots with nothing new are left out."""
    out: list[tuple[int, Tally]] = []
    for start in sorted(after):
        earlier = before.get(start)
        delta = after[start] if earlier is None else after[start].minus(earlier)
        if not delta.empty:
            out.append((start, delta))
    return out


@dataclass
class Folded:
    """A window's value in the history's tables: its tally, and for each worker the time
    of its last report folded in and what that report said of the window's slots.

    Each value carries its own "what was already counted", so folding a report into it
    is exact and idempotent by itself: a report no newer than the last one of its worker
    adds nothing, and a newer one adds its slots minus what that last one said. No other
    table has to be in step with it (faust-streaming wrote a table's changelog ahead of
    its committed offsets in our kill tests; see docs/history.md)."""

    tally: Tally = field(default_factory=Tally)
    seen: dict[str, tuple[int, dict[int, Tally]]] = field(default_factory=dict)

    def fold(self, worker_id: str, at_ms: int, slots: Mapping[int, Tally]) -> Folded | None:
        """This value with a report of `worker_id` taken at `at_ms`, whose slots that fall
        in this window are `slots`; None if it adds nothing (an old report read again, or
        nothing new)."""
        last = self.seen.get(worker_id)
        if last is not None and at_ms <= last[0]:
            return None
        deltas = slot_deltas(last[1] if last is not None else {}, slots)
        seen = dict(self.seen)
        seen[worker_id] = (at_ms, dict(slots))
        return Folded(self.tally.plus(total_of(deltas)), seen)

    def forget_before(self, oldest_ms: int) -> None:
        """Drop workers whose last report folded here is older than `oldest_ms`: a report
        of theirs can no longer be read again (their slots left every report)."""
        for worker_id in [w for w, (at_ms, _) in self.seen.items() if at_ms < oldest_ms]:
            del self.seen[worker_id]

    def to_obj(self) -> dict[str, Any]:
        return {"tally": self.tally.to_obj(),
                "seen": {w: {"at_ms": at_ms,
                             "slots": {str(s): t.to_obj() for s, t in slots.items()}}
                         for w, (at_ms, slots) in self.seen.items()}}

    @classmethod
    def from_obj(cls, raw: object) -> Folded:
        if not raw:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError("a window's value is an object")
        seen = {str(w): (int(v["at_ms"]), {int(s): Tally.from_obj(t)
                                           for s, t in dict(v["slots"]).items()})
                for w, v in dict(raw.get("seen", {})).items()}
        return cls(Tally.from_obj(raw.get("tally", {})), seen)


def total_of(deltas: list[tuple[int, Tally]]) -> Tally:
    out = Tally()
    for _, delta in deltas:
        out = out.plus(delta)
    return out


def in_window(slots: Mapping[int, Tally], begins_ms: int, size_s: int) -> dict[int, Tally]:
    """The slots (by start) that fall in the window of `size_s` starting at `begins_ms`."""
    return {s: t for s, t in slots.items() if window_start(s, size_s) == begins_ms}


__all__ = ["HOURS_KEPT_S", "MINUTES_KEPT_S", "SLOTS_KEPT", "SPANS", "Folded", "SlotTallies",
           "Windows", "in_window", "slot_deltas", "total_of", "window_start"]
