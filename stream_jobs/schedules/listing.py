"""What `stream-jobs schedules list` and the dashboard show: every schedule of the
deployment, from its declaration and its row, with its type's leader.

`schedule_views` is pure (declarations + rows + leaders + now); `read_schedules` does the
reading. A schedule declared in topics/ that no scheduler has run yet has no row and is
shown from its declaration; one declared in code (`@app.periodic`) is known from its row
once a scheduler has run it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from stream_jobs import clock
from stream_jobs.errors import ConfigError
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.periodic import ScheduleSpec
from stream_jobs.schedules.leader import leader_sessions
from stream_jobs.schedules.state import ScheduleState, read_states
from stream_jobs.schedules.timing import next_fire_ms
from stream_jobs.settings import Settings

# A next fire time this far in the past means no leader is firing it.
OVERDUE_MS = 5_000


@dataclass(frozen=True)
class ScheduleView:
    """One schedule as an operator sees it."""

    job_type: str
    name: str
    fires: str  # "cron 0 3 * * * (Europe/Berlin)", "every 5m"
    timezone: str
    paused: bool
    next_fire_ms: int | None
    overdue: bool  # its next fire time passed more than OVERDUE_MS ago
    last_fired_ms: int | None
    last_job_id: str | None
    last_enqueued_at: datetime | None
    missed_total: int
    leader: str | None
    spec: ScheduleSpec | None  # None: declared in code and known from its row only
    leader_seen: datetime | None = None  # when the leader's session last changed state

    def lease_ends(self, lease_s: float) -> datetime | None:
        """When Postgres ends the leader's session if it stops touching it (a live leader
        touches it every quarter lease, so this keeps moving while it leads)."""
        if self.leader is None or self.leader_seen is None:
            return None
        return self.leader_seen + timedelta(seconds=lease_s)

    def when(self, ms: int | None) -> str:
        """A fire time on the schedule's clock, e.g. "2026-03-29 03:00:00 CEST"."""
        return fire_text(ms, self.timezone)


def fire_text(ms: int | None, timezone: str) -> str:
    if ms is None:
        return "—"
    zone = ZoneInfo(timezone) if timezone != "UTC" else UTC
    return datetime.fromtimestamp(ms / 1000, tz=zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def schedule_views(types: Mapping[str, JobTypePolicy], states: Sequence[ScheduleState],
                   holders: Mapping[str, str], now_ms: int,
                   seen: Mapping[str, datetime | None] | None = None) -> list[ScheduleView]:
    """Declared schedules and rows, merged by (type, name), sorted by type and name;
    `seen`: when each leader's session last changed state."""
    rows = {(s.job_type, s.name): s for s in states}
    declared = {(p.job_type, spec.name): spec for p in types.values() for spec in p.schedules}
    views = []
    for key in sorted(set(rows) | set(declared)):
        job_type, name = key
        spec, row = declared.get(key), rows.get(key)
        if spec is not None:
            nxt = next_fire_ms(spec, row.horizon_ms if row is not None else now_ms)
            fires, zone = spec.describe(), spec.timezone
        else:
            assert row is not None
            nxt, fires, zone = row.next_fire_ms, row.spec, _zone_of(row.spec)
        paused = row.paused if row is not None else False
        views.append(ScheduleView(
            job_type, name, fires, zone, paused, nxt,
            not paused and nxt is not None and now_ms - nxt > OVERDUE_MS,
            row.last_fired_ms if row else None, row.last_job_id if row else None,
            row.last_enqueued_at if row else None, row.missed_total if row else 0,
            holders.get(job_type), spec, (seen or {}).get(job_type)))
    return views


def _zone_of(spec_text: str) -> str:
    # "cron 0 3 * * * (Europe/Berlin)": the zone a code-declared schedule was written for.
    if spec_text.endswith(")") and "(" in spec_text:
        zone = spec_text.rsplit("(", 1)[1][:-1]
        try:
            ZoneInfo(zone)
        except (ValueError, KeyError):
            return "UTC"
        return zone
    return "UTC"


async def read_schedules(settings: Settings,
                         types: Mapping[str, JobTypePolicy]) -> list[ScheduleView]:
    """Every schedule of the deployment now (DatabaseUnavailable, or ConfigError asking
    for `db migrate`, when Postgres cannot tell)."""
    states = await read_states(settings, settings.topic_prefix)
    names = sorted({s.job_type for s in states} | {t for t, p in types.items() if p.schedules})
    sessions = await leader_sessions(settings, names)
    return schedule_views(types, states, {t: name for t, (name, _) in sessions.items()},
                          clock.now_ms(), {t: at for t, (_, at) in sessions.items()})


def find_schedule(views: Sequence[ScheduleView], name: str,
                  job_type: str | None = None) -> ScheduleView:
    """The schedule called `name` (in `job_type` if given); ConfigError if there is none
    or the name is ambiguous."""
    found = [v for v in views if v.name == name and job_type in (None, v.job_type)]
    if len(found) == 1:
        return found[0]
    if found:
        types = ", ".join(v.job_type for v in found)
        raise ConfigError(f"Schedule {name!r} exists in several types ({types}); add "
                          "--type to say which.")
    where = f" of {job_type!r}" if job_type else ""
    known = ", ".join(sorted({f"{v.job_type}:{v.name}" for v in views})) or "none"
    raise ConfigError(f"No schedule {name!r}{where} is declared in topics/ or has run yet "
                      f"(known: {known}).")
