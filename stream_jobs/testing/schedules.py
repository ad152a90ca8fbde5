"""The app's schedules on a `JobTester`'s virtual time: each firing enqueued at its time.

A firing is what the real scheduler makes of it: the due firings of a schedule under its
missed policy (`due_firings`), each under its derived job ID (`firing_job_id`, so a
firing enqueued twice runs once), the payload from the TOML or the `@app.periodic`
function (`Scheduler.payload_for`, which refuses a payload that does not fit). What is
left out is what needs Postgres: the leader's lock and the state table. Every schedule
starts from the tester's start time (a new schedule misses nothing before it), and the
tester moves the clock to each fire time in turn, so no firing is ever late.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stream_jobs.app import App
from stream_jobs.client import Job, JobClient
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka.clients import KafkaClients
from stream_jobs.periodic import ScheduleSpec
from stream_jobs.schedules import Scheduler, due_firings, firing_job_id
from stream_jobs.schedules.timing import next_fire_ms


@dataclass(frozen=True)
class Firing:
    """One firing the tester enqueued."""

    job_type: str
    schedule: str
    fire_ms: int
    job_id: str


class VirtualSchedules:
    """The schedules of `types` (in their TOML and in `@app.periodic`)."""

    def __init__(self, app: App, types: Mapping[str, JobTypePolicy], kafka: KafkaClients,
                 start_ms: int) -> None:
        self._prefix = app.settings.topic_prefix
        self._schedulers: dict[str, Scheduler] = {}
        for job_type, policy in sorted(types.items()):
            scheduler = app.scheduler(job_type, policy=policy, kafka=kafka)
            if scheduler is not None:
                self._schedulers[job_type] = scheduler
        self._horizons: dict[tuple[str, str], int] = {
            (job_type, spec.name): start_ms
            for job_type, scheduler in self._schedulers.items() for spec in scheduler.specs}
        self.fired: list[Firing] = []

    def _specs(self) -> list[tuple[str, ScheduleSpec]]:
        return [(job_type, spec) for job_type, scheduler in self._schedulers.items()
                for spec in scheduler.specs]

    def next_fires_ms(self) -> list[int]:
        """Each schedule's next fire time after what it has handled."""
        found = []
        for job_type, spec in self._specs():
            nxt = next_fire_ms(spec, self._horizons[(job_type, spec.name)])
            if nxt is not None:
                found.append(nxt)
        return found

    async def fire_due(self, now_ms: int, client: JobClient) -> list[Firing]:
        """Enqueue every firing due at `now_ms`; what was enqueued."""
        made: list[Firing] = []
        for job_type, spec in self._specs():
            key = (job_type, spec.name)
            due = due_firings(spec, self._horizons[key], now_ms)
            if not due.fire_ms:
                self._horizons[key] = due.horizon_ms
                continue
            scheduler = self._schedulers[job_type]
            firings = [Firing(job_type, spec.name, at,
                              firing_job_id(self._prefix, job_type, spec.name, at))
                       for at in due.fire_ms]
            jobs = [Job(job_type, await scheduler.payload_for(spec, f.fire_ms), job_id=f.job_id)
                    for f in firings]
            await client.enqueue_many(jobs)
            self._horizons[key] = due.horizon_ms
            made.extend(firings)
        self.fired.extend(made)
        return made


__all__ = ["Firing", "VirtualSchedules"]
