"""Wall-clock time as stream-jobs stamps records, reports and letters: Unix milliseconds.

Kafka timestamps, `sj-*` header times and report times are all Unix ms; this is the one
place that reads the clock for them. Intervals and deadlines use the event loop's
monotonic clock instead.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch, now."""
    return time.time_ns() // 1_000_000
