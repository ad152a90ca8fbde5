"""Wall-clock time as stream-jobs stamps records, reports and letters: Unix milliseconds.

Kafka timestamps, `sj-*` header times and report times are all Unix ms; this is the one
place that reads the clock for them. Intervals and deadlines use the event loop's
monotonic clock instead.

`reading(clock)` makes `now_ms` read another clock for a while: `stream_jobs.testing`'s
`JobTester` reads a virtual one, so a test moves time (a retry's delay, an expiry, a
schedule's next firing) instead of waiting for it. Nothing else sets it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from stream_jobs.errors import ConfigError


class WallClock(Protocol):
    """A clock `now_ms` may read instead of the system's."""

    def now_ms(self) -> int: ...


# None: the system clock. A module global, not a context variable: the runtime's tasks
# and handler threads must all see the clock a test moves, whoever started them.
_instead: WallClock | None = None


def now_ms() -> int:
    """Milliseconds since the Unix epoch, now."""
    instead = _instead
    if instead is None:
        return time.time_ns() // 1_000_000
    return instead.now_ms()


@contextmanager
def reading(clock: WallClock) -> Iterator[None]:
    """Make `now_ms` read `clock` until the block ends (one such clock at a time)."""
    global _instead
    if _instead is not None:
        raise ConfigError("Another virtual clock is in use in this process (a JobTester "
                          "still open?): close it before starting another.")
    _instead = clock
    try:
        yield
    finally:
        _instead = None
