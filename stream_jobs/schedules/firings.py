"""A firing: one fire time of one schedule, its job ID, and which due firings run. Pure.

A firing's job ID is derived, not drawn: the same (prefix, type, schedule, fire time)
always gives the same ID. Two schedulers, a failover or a restart that enqueue one
firing twice therefore enqueue one job ID twice, and the dedup table runs its effects
once (the second copy is counted `duplicate`). The ID is a UUIDv7 whose time is the fire
time, so it sorts with other job IDs and `stream-jobs job ID` narrows its scan by it;
its other 74 bits come from SHA-256 of the four parts.

Which due firings run is the missed policy's business (`due_firings`): a firing less
than `LATE_S` overdue is late, not missed, and runs under every policy, so a failover, a
restart or a slow machine loses nothing. Older firings were missed: `latest` runs the
newest of them once (unless a late firing runs anyway), `skip` none, `all` every one,
the newest `MAX_CATCH_UP` at most.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from stream_jobs.periodic import ScheduleSpec
from stream_jobs.schedules.timing import fire_times

# Overdue by at most this, a firing is late rather than missed: it covers a failover (a
# paused leader's lease is 10 s by default), a restart and a loaded machine.
LATE_S = 30.0
# `missed = "all"` runs at most this many firings in one catch-up (the newest ones): a
# minutely schedule after a week away would otherwise enqueue 10,080 jobs at once.
MAX_CATCH_UP = 100
# The 48-bit millisecond field of a UUIDv7 ends in the year 10889.
_MAX_MS = (1 << 48) - 1


@dataclass(frozen=True)
class Due:
    """What a scheduler does with a schedule now: enqueue `fire_ms` (oldest first), and
    then consider everything up to `horizon_ms` handled; `dropped` firings were due but
    the missed policy leaves them out (for cron, counted up to timing.COUNT_LIMIT)."""

    fire_ms: tuple[int, ...]
    horizon_ms: int
    dropped: int = 0


def due_firings(spec: ScheduleSpec, horizon_ms: int, now_ms: int) -> Due:
    """The firings of `spec` due at `now_ms` when every fire time up to `horizon_ms` has
    been handled, under the spec's missed policy."""
    times, total = fire_times(spec, horizon_ms, now_ms, newest=MAX_CATCH_UP)
    if not times:
        return Due((), horizon_ms)
    late = [t for t in times if now_ms - t <= LATE_S * 1000]
    if spec.missed == "all":
        run = times
    elif spec.missed == "skip":
        run = late
    else:  # latest: one run catches up
        run = late or times[-1:]
    return Due(tuple(run), times[-1], total - len(run))


def firing_job_id(prefix: str, job_type: str, schedule: str, fire_ms: int) -> str:
    """The job ID of `schedule`'s firing at `fire_ms` (a UUIDv7 string, 36 characters)."""
    if not 0 <= fire_ms <= _MAX_MS:
        raise ValueError(f"fire time {fire_ms} ms is outside what a UUIDv7 can hold")
    digest = hashlib.sha256(
        "\0".join(("stream-jobs firing", prefix, job_type, schedule, str(fire_ms))).encode()
    ).digest()
    bits = int.from_bytes(digest[:10], "big")  # 80 bits: 12 for rand_a, 62 for rand_b
    value = (fire_ms << 80 | 0x7 << 76 | (bits >> 68) << 64 | 0b10 << 62
             | bits & 0x3FFF_FFFF_FFFF_FFFF)
    text = value.to_bytes(16, "big").hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
