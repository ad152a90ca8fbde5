"""Pause, resume and trigger a schedule as an operator does: what `stream-jobs schedules
pause|resume|trigger` and the dashboard's buttons both call, so each rule is in one place.

A schedule is found by name (and type, when the name is in several) among those declared
in topics/ and those with a row (`schedules.listing`). Pausing one no scheduler has run
yet makes its row, paused; resuming does not catch up the firings that fell due while it
was paused; a trigger enqueues one run now under a new job ID (not one of its firings,
so it is not deduplicated against them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from stream_jobs import clock
from stream_jobs.app import App
from stream_jobs.client import JobClient
from stream_jobs.errors import ConfigError
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.schedules.listing import ScheduleView, find_schedule, read_schedules
from stream_jobs.schedules.scheduler import Payload
from stream_jobs.schedules.state import declare_paused, set_paused
from stream_jobs.schedules.timing import local_time
from stream_jobs.settings import Settings


@dataclass(frozen=True)
class Triggered:
    """One run of a schedule, enqueued now."""

    job_type: str
    name: str
    job_id: str
    at: datetime  # the run's time on the schedule's clock

    def summary(self) -> str:
        return f"{self.job_type}:{self.name} triggered at {self.at.isoformat()}: job {self.job_id}"


async def find(settings: Settings, types: Mapping[str, JobTypePolicy], name: str,
               job_type: str | None = None) -> ScheduleView:
    """The schedule `name` (of `job_type`); ConfigError if there is none or it is ambiguous."""
    return find_schedule(await read_schedules(settings, types), name, job_type)


async def set_schedule_paused(settings: Settings, types: Mapping[str, JobTypePolicy],
                              name: str, job_type: str | None, paused: bool) -> str:
    """Pause (returns once a firing in progress has committed) or resume `name`; a
    sentence saying what was done."""
    view = await find(settings, types, name, job_type)
    done = await set_paused(settings, settings.topic_prefix, view.job_type, name, paused)
    if not done:
        if not paused or view.spec is None:
            return f"{view.job_type}:{name} was not paused"
        await declare_paused(settings, settings.topic_prefix, view.job_type, view.spec,
                             clock.now_ms())
    what = ("paused: no firing starts until it is resumed" if paused
            else "resumed: firings due while it was paused are not caught up")
    return f"{view.job_type}:{name} {what}"


async def trigger_schedule(settings: Settings, types: Mapping[str, JobTypePolicy], name: str,
                           job_type: str | None = None, job_app: App | None = None
                           ) -> Triggered:
    """Enqueue one run of `name` now with a new job ID. A schedule whose payload is
    computed in code (`@app.periodic`) needs its `job_app`."""
    view = await find(settings, types, name, job_type)
    policy = get_job_type(types, view.job_type)
    fire_ms = clock.now_ms()
    spec = view.spec
    payload: Payload
    if spec is not None and not spec.in_code:
        payload = spec.payload
    else:
        if job_app is None:
            raise ConfigError(f"Schedule {name!r} computes its payload in code "
                              "(@app.periodic): trigger it from the shell with "
                              "`stream-jobs schedules trigger NAME --app MODULE:APP`.")
        declared = job_app.periodic_jobs.get(view.job_type, {}).get(name)
        if declared is None:
            raise ConfigError(f"The app declares no schedule {name!r} of {view.job_type!r}.")
        spec = declared[0]  # a schedule declared in code has no spec in topics/
        runner = job_app.scheduler(view.job_type)
        assert runner is not None
        payload = await runner.payload_for(spec, fire_ms)
    models = job_app.models() if job_app is not None else {}
    async with JobClient(settings, {policy.job_type: policy}, models=models) as client:
        job_id = await client.enqueue(policy.job_type, payload)
    return Triggered(view.job_type, name, job_id, local_time(spec, fire_ms))


__all__ = ["Triggered", "find", "set_schedule_paused", "trigger_schedule"]
