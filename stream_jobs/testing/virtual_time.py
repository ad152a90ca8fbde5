"""Virtual time for `JobTester`: a wall clock that moves only when the tester moves it,
and the rule for where it moves next. The rule is pure.

While a tester is open, `stream_jobs.clock.now_ms` reads its `VirtualClock`, so every
stamp and comparison the runtime makes (enqueued-at, not-before, expires-at, the retry
decision's due time, the relay's "is the head due?", a schedule's firings) is on virtual
time. Only the tester moves it, and only forward: to the next moment something is due,
so a job that waits 10 minutes in `retry-10m` runs at once, and nothing runs early.
Intervals the event loop measures (a handler's timeout, the commit interval) stay real.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from stream_jobs.errors import ConfigError


class VirtualClock:
    """Unix ms that stay put until `move_to` (a `stream_jobs.clock.WallClock`)."""

    def __init__(self, start_ms: int) -> None:
        self._ms = start_ms

    def now_ms(self) -> int:
        return self._ms

    def move_to(self, at_ms: int) -> None:
        if at_ms < self._ms:
            raise ConfigError(f"Virtual time only moves forward: it is {self._ms} ms, not "
                              f"{at_ms} ms.")
        self._ms = at_ms

    @property
    def now(self) -> datetime:
        return datetime.fromtimestamp(self._ms / 1000, tz=UTC)


def start_ms_of(start: datetime | None, system_ms: int) -> int:
    """Where a tester's clock starts: `start` (naive means UTC), else the system's now."""
    if start is None:
        return system_ms
    aware = start if start.tzinfo is not None else start.replace(tzinfo=UTC)
    return round(aware.timestamp() * 1000)


def next_stop(now_ms: int, held: Iterable[int], firings: Iterable[int],
              until_ms: int | None) -> int | None:
    """Where to move the clock next, or None when the run is over.

    `held`: when each record held in a delay tier is due; `firings`: the schedules' next
    fire times; times not after `now_ms` are being handled already and count for nothing.
    Without `until_ms` (run until idle) the clock moves while records are held, to the
    earliest of those and the firings before them; a schedule alone keeps nothing going
    (it fires for ever). With `until_ms` (advance) it moves to every due time up to
    `until_ms`, then to `until_ms` itself. Never backwards, never past `until_ms`.
    """
    later_held = [at for at in held if at > now_ms]
    later_firings = [at for at in firings if at > now_ms]
    if until_ms is None:
        return min(later_held + later_firings) if later_held else None
    due = [at for at in later_held + later_firings if at <= until_ms]
    if due:
        return min(due)
    return until_ms if now_ms < until_ms else None


__all__ = ["VirtualClock", "next_stop", "start_ms_of"]
