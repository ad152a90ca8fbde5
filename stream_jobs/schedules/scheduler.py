"""The scheduler of one job type: waits to lead it, then enqueues each due firing.

Every worker of a type runs one (and `stream-jobs scheduler APP` runs them alone); the
one holding the type's lock (`leader.Leadership`) fires, the others wait in Postgres for
the lock. Per schedule and pass, the leader:

1. reads the row (paused? horizon?) and works out the due firings under the missed
   policy (`firings.due_firings`), computing `@app.periodic` payloads outside any
   transaction;
2. in one transaction on its lock session: locks the row, checks it again, enqueues the
   firings through a `JobClient` with their derived job IDs (waiting for the broker's
   acks, bounded well inside the lease), and moves the horizon.

A firing that cannot be enqueued (Kafka down, a payload function that raised, a payload
its model refuses) is retried a quarter lease later, and counts as missed by the policy
if it stays overdue past `firings.LATE_S`. Postgres failing ends the leadership: the
scheduler waits for the lock again on a new session.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel

from stream_jobs import clock
from stream_jobs.errors import (
    DatabaseUnavailable,
    LeadershipLost,
    PayloadError,
    PublishError,
    StreamJobsError,
)
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.jobs import Job
from stream_jobs.periodic import ScheduleSpec
from stream_jobs.schedules import state
from stream_jobs.schedules.firings import Due, due_firings, firing_job_id
from stream_jobs.schedules.leader import Leadership
from stream_jobs.schedules.timing import local_time, next_fire_ms
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.scheduler")

Payload = BaseModel | Mapping[str, Any]
# `@app.periodic`: called with the firing's scheduled time (aware, on the schedule's
# clock); returns the payload, or an awaitable of it.
PayloadFunc = Callable[[datetime], Payload | Awaitable[Payload]]



class FiringClient(Protocol):
    """What a scheduler sends its firings with: the app's `JobClient` for the type (made by
    `App.scheduler`), entered once per `run`."""

    async def __aenter__(self) -> FiringClient: ...

    async def __aexit__(self, *exc_info: Any) -> None: ...

    async def enqueue_many(self, jobs: Iterable[Job], *, conn: Any = None) -> list[str]: ...


# Seconds between attempts to reach Kafka or Postgres again after they failed.
RETRY_S = 1.0


class Scheduler:
    """The schedules of one type; `run()` until `request_stop()` or cancellation."""

    def __init__(self, settings: Settings, policy: JobTypePolicy,
                 specs: Sequence[ScheduleSpec], *, client: Callable[[], FiringClient],
                 payloads: Mapping[str, PayloadFunc] | None = None,
                 lease_s: float | None = None, holder: str | None = None) -> None:
        self.settings = settings
        self.make_client = client
        self.policy = policy
        self.job_type = policy.job_type
        self.specs = tuple(specs)
        self.payloads = dict(payloads or {})
        missing = [s.name for s in self.specs if s.in_code and s.name not in self.payloads]
        if missing:
            raise ValueError(f"schedules {missing} compute their payload in code, but no "
                             "function was given for them")
        self.lease_s = lease_s or settings.scheduler_lease_s
        self.leadership = Leadership(settings, self.job_type, lease_s=self.lease_s,
                                     holder=holder)
        self.is_leader = False
        self.leader_since_ms: int | None = None
        self.fired = 0  # firings this scheduler enqueued
        self.dropped = 0  # firings its passes left out (the missed policy)
        self.failures = 0  # passes that could not enqueue a schedule's firings
        self.paused_passes: dict[str, int] = {}  # passes that found a schedule paused
        self._stopping = asyncio.Event()
        # Per schedule: the horizon last seen, and when to look at it again (Unix ms).
        self._horizons: dict[str, int] = {}
        self._recheck_ms: dict[str, int] = {}

    @property
    def heartbeat_s(self) -> float:
        return self.lease_s / 4

    def request_stop(self) -> None:
        """Stop leading and return from `run` (safe from a signal handler on the loop)."""
        self._stopping.set()

    async def run(self) -> None:
        """Wait for the lock and fire due firings while holding it, again after every
        loss, until stopped. Kafka or Postgres being down is waited out, not raised."""
        client = await self._client()
        if client is None:
            return
        try:
            while not self._stopping.is_set():
                try:
                    await self._lead(client)
                except StreamJobsError as exc:
                    what = "stopped leading" if self.is_leader else "cannot wait for the lock of"
                    log.warning("%s %s's schedules: %s", what, self.job_type, exc)
                finally:
                    self.is_leader = False
                    await self.leadership.resign()
                await self._wait(RETRY_S)
        finally:
            await client.__aexit__(None, None, None)

    async def _client(self) -> FiringClient | None:
        while not self._stopping.is_set():
            client = self.make_client()
            try:
                return await client.__aenter__()
            except StreamJobsError as exc:
                log.warning("scheduler of %s cannot reach Kafka yet: %s", self.job_type, exc)
                await self._wait(RETRY_S)
        return None

    async def _lead(self, client: FiringClient) -> None:
        if not await self._acquire():
            return
        self.is_leader = True
        self.leader_since_ms = clock.now_ms()
        log.info("%s leads the schedules of %s (%s)", self.leadership.holder, self.job_type,
                 ", ".join(s.name for s in self.specs))
        conn = self.leadership.connection
        try:
            async with state.guarded(self.settings):
                for spec in self.specs:
                    horizon = await state.ensure(conn, self.settings.topic_prefix,
                                                 self.job_type, spec, clock.now_ms())
                    self._seen(spec, horizon)
        except DatabaseUnavailable as exc:
            raise LeadershipLost(f"the lock session failed: {exc}") from exc
        while not self._stopping.is_set():
            now = clock.now_ms()
            due = [s for s in self.specs if self._recheck_ms[s.name] <= now]
            for spec in due:
                await self._fire(conn, client, spec)
            if not due:
                await self.leadership.confirm()
            await self._wait(self._until_next_s())

    async def _acquire(self) -> bool:
        """Wait for the lock, or for a stop (False)."""
        acquiring = asyncio.create_task(self.leadership.acquire())
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not acquiring.done():
                acquiring.cancel()
                await asyncio.gather(acquiring, return_exceptions=True)
        if acquiring.cancelled():
            return False
        acquiring.result()  # raises DatabaseUnavailable
        return True

    def _seen(self, spec: ScheduleSpec, horizon_ms: int) -> None:
        self._horizons[spec.name] = horizon_ms
        nxt = next_fire_ms(spec, horizon_ms)
        # A schedule that never fires again is looked at each heartbeat (its spec may be
        # the only thing that changes that, on the next deploy).
        self._recheck_ms[spec.name] = nxt if nxt is not None else self._later_ms()

    def _later_ms(self) -> int:
        return clock.now_ms() + round(self.heartbeat_s * 1000)

    def _until_next_s(self) -> float:
        soonest = min([*self._recheck_ms.values(), self._later_ms()])
        return max(0.0, (soonest - clock.now_ms()) / 1000)

    async def _fire(self, conn: Any, client: FiringClient, spec: ScheduleSpec) -> None:
        try:
            async with state.guarded(self.settings):
                due, ids = await self._fire_in(conn, client, spec)
        except DatabaseUnavailable as exc:
            raise LeadershipLost(f"the lock session failed: {exc}") from exc
        except StreamJobsError as exc:
            self.failures += 1
            log.warning("%s schedule %r: firing not enqueued, retried in %.1f s: %s",
                        self.job_type, spec.name, self.heartbeat_s, exc)
            self._recheck_ms[spec.name] = self._later_ms()
            return
        if due is not None:
            self._fired(spec, due, ids)

    async def _fire_in(self, conn: Any, client: FiringClient,
                       spec: ScheduleSpec) -> tuple[Due | None, list[str]]:
        """One schedule's pass: (what was due and enqueued, their job IDs), or (None, [])
        when it was paused or gone."""
        prefix = self.settings.topic_prefix
        now = clock.now_ms()
        found = await state.peek(conn, prefix, self.job_type, spec.name)
        if found is None or found[0]:
            # Gone (made again) or paused: look again in a while.
            if found is None:
                await state.ensure(conn, prefix, self.job_type, spec, now)
            else:
                self.paused_passes[spec.name] = self.paused_passes.get(spec.name, 0) + 1
            self._recheck_ms[spec.name] = self._later_ms()
            return None, []
        planned = due_firings(spec, found[1], now)
        payloads = {t: await self.payload_for(spec, t) for t in planned.fire_ms}
        async with conn.transaction():
            claimed = await state.claim(conn, prefix, self.job_type, spec.name)
            if claimed is None or claimed[0]:
                self._recheck_ms[spec.name] = self._later_ms()
                return None, []
            # Same `now`, a horizon at least as far: a subset of what was planned.
            due = due_firings(spec, claimed[1], now)
            ids = [firing_job_id(prefix, self.job_type, spec.name, t) for t in due.fire_ms]
            if ids:
                jobs = [Job(self.job_type, payloads[t], job_id=job_id)
                        for t, job_id in zip(due.fire_ms, ids, strict=True)]
                await self._enqueue(client, jobs)
            await state.record(conn, prefix, self.job_type, spec, due, ids)
        return due, ids

    def _fired(self, spec: ScheduleSpec, due: Due, ids: list[str]) -> None:
        self.fired += len(ids)
        self.dropped += due.dropped
        self._seen(spec, max(due.horizon_ms, self._horizons.get(spec.name, due.horizon_ms)))
        if due.dropped:
            log.info("%s schedule %r: %d missed firings left out (missed = %r)",
                     self.job_type, spec.name, due.dropped, spec.missed)
        for fire, job_id in zip(due.fire_ms, ids, strict=True):
            log.debug("%s schedule %r fired for %s as job %s", self.job_type, spec.name,
                      local_time(spec, fire).isoformat(), job_id)

    async def _enqueue(self, client: FiringClient, jobs: list[Job]) -> None:
        # The row stays locked meanwhile and the session is idle in its transaction, which
        # Postgres ends after the lease: give up well before, and try again later.
        try:
            await asyncio.wait_for(client.enqueue_many(jobs), timeout=self.lease_s / 2)
        except TimeoutError:
            raise PublishError(f"the broker did not acknowledge the firings within "
                               f"{self.lease_s / 2:g} s") from None

    async def payload_for(self, spec: ScheduleSpec, fire_ms: int) -> Payload:
        """The payload of `spec`'s firing at `fire_ms`: the declared one, or what its
        `@app.periodic` function returns (PayloadError if it raises)."""
        if not spec.in_code:
            return spec.payload
        func = self.payloads[spec.name]
        try:
            made = func(local_time(spec, fire_ms))
            if inspect.isawaitable(made):
                made = await made
        except Exception as exc:  # the user's code: whatever it raises, this firing waits
            raise PayloadError(f"the payload function of schedule {spec.name!r} raised "
                               f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(made, BaseModel | Mapping):
            raise PayloadError(f"the payload function of schedule {spec.name!r} returned "
                               f"{type(made).__name__}; return a dict or a pydantic model")
        return made

    async def _wait(self, seconds: float) -> bool:
        """Wait `seconds` or until stopped; True if stopped."""
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

