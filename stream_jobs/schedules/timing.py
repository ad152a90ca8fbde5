"""When a schedule fires: the fire times after a moment, and those in a span. Pure.

Fire times are Unix milliseconds. `every` counts elapsed time from the Unix epoch, so
`every = "5m"` fires at :00, :05, :10 UTC whatever the timezone, and daylight saving
never moves it. `cron` is read on the wall clock of the schedule's timezone by cronsim,
which follows Debian cron across DST changes (docs/schedules.md, "Timezones and DST"):

- spring forward: a fixed-time firing inside the skipped hour (02:30 in Europe/Berlin
  on 2026-03-29) fires once, at the first minute after the gap (03:00 CEST);
- fall back: a fixed-time firing inside the repeated hour fires once, at its first
  occurrence (02:30 CEST, not again at 02:30 CET); a firing whose minute or hour field
  starts with `*` (`0 * * * *`, `*/15 * * * *`) follows real time and fires in both
  copies of the hour (two instants, two firings, two job IDs).

cronsim computes fixed-time expressions on a naive wall clock, which cannot tell the two
copies of a repeated hour apart. Going forward from inside the second copy it can answer
a time before the start (filtered out here); going back from there it would skip the
first copy's firings, so the walk back starts from the first wall time after the end
that is not ambiguous. Callers get times strictly after `after_ms`, at most `until_ms`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

from cronsim import CronSim

from stream_jobs.periodic import ScheduleSpec

# How many cron fire times a span is counted up to (the count only feeds the `missed`
# figure; the firings themselves are the newest few).
COUNT_LIMIT = 1_000
# A cron answer before the start (see the module's docstring) is skipped; more than a
# few in a row would be a bug, not a DST change.
_MAX_SKIPS = 1_000
# Steps past a repeated hour's wall times (every zone's changes are whole quarter hours).
_AMBIGUITY_STEP_MS = 15 * 60_000


def next_fire_ms(spec: ScheduleSpec, after_ms: int) -> int | None:
    """The first fire time strictly after `after_ms`; None if the expression never
    matches again (cronsim looks 50 years ahead)."""
    every = spec.every_ms
    if every is not None:
        return (after_ms // every + 1) * every
    for fire in _forward(spec, after_ms):
        return fire
    return None


def fire_times(spec: ScheduleSpec, after_ms: int, until_ms: int, *,
               newest: int) -> tuple[list[int], int]:
    """The newest `newest` fire times in (after_ms, until_ms], oldest first, and how many
    there are in that span in all (for cron, counted up to COUNT_LIMIT)."""
    if until_ms <= after_ms or newest < 1:
        return [], 0
    every = spec.every_ms
    if every is not None:
        first = (after_ms // every + 1) * every
        last = until_ms // every * every
        if last < first:
            return [], 0
        total = (last - first) // every + 1
        start = max(first, last - (newest - 1) * every)
        return list(range(start, last + 1, every)), total
    found: list[int] = []
    total = 0
    for fire in _backward(spec, until_ms):
        if fire <= after_ms:
            break
        total += 1
        if len(found) < newest:
            found.append(fire)
        elif total >= COUNT_LIMIT:
            break
    found.reverse()
    return found, total


def local_time(spec: ScheduleSpec, fire_ms: int) -> datetime:
    """A fire time as an aware datetime on the schedule's wall clock (UTC for `every`)."""
    return datetime.fromtimestamp(fire_ms / 1000, tz=spec.zone)


def _forward(spec: ScheduleSpec, after_ms: int) -> Iterator[int]:
    assert spec.cron is not None
    zone = spec.zone
    skipped = 0
    for moment in CronSim(spec.cron, _aware(after_ms, zone)):
        fire = _ms(moment)
        if fire > after_ms:
            yield fire
        else:
            skipped += 1
            if skipped > _MAX_SKIPS:
                return


def _backward(spec: ScheduleSpec, until_ms: int) -> Iterator[int]:
    assert spec.cron is not None
    zone = spec.zone
    # Cron matches fall on whole seconds, so a match at or before `until_ms` is one at or
    # before its whole second; reverse iteration starts just past that second (it returns
    # matches strictly before a start that has no fraction), or later still while that
    # wall time is ambiguous (answers past `until_ms` are dropped below).
    start = (until_ms // 1000 + 1) * 1000
    while _ambiguous(start, zone):
        start += _AMBIGUITY_STEP_MS
    skipped = 0
    previous: int | None = None
    for moment in CronSim(spec.cron, _aware(start, zone), reverse=True):
        fire = _ms(moment)
        if fire > until_ms or (previous is not None and fire >= previous):
            skipped += 1
            if skipped > _MAX_SKIPS:
                return
            continue
        previous = fire
        yield fire


def _ambiguous(ms: int, zone: ZoneInfo) -> bool:
    """Whether the wall time of `ms` in `zone` names two instants (a repeated hour)."""
    moment = _aware(ms, zone)
    return moment.replace(fold=1 - moment.fold).utcoffset() != moment.utcoffset()


def _aware(ms: int, zone: ZoneInfo) -> datetime:
    # From the instant, never by adding to a wall time: that would drop the `fold` of a
    # time in the repeated hour and name the other instant.
    return datetime.fromtimestamp(ms / 1000, tz=zone)


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)
