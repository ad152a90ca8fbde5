"""The blocked-loop warning: an `async def` handler that blocks the event loop (a
`time.sleep`, a sync driver call) for more than a second is logged with its job.

While the loop is blocked nothing else of the process runs: no fetch, no commit, no
heartbeat to a consumer group (miss enough and the group evicts the worker), no other
job, of any type. So the watch is one per loop, whatever the number of types on it
(`stream-jobs worker` runs them all on one loop): each type's `Worker` joins it with a
`LoopWatch`, and a stall is reported once, naming the job that caused it.

The detector costs the job path nothing: the loop refreshes a timestamp from a timer
ten times a second, and a daemon thread compares it with the clock. When the loop is
late by more than `warn_after_s`, the thread asks which task the loop is running (the
running task of a loop is readable from any thread: while a handler blocks, it is the
task of the runner calling it) and which worker's runner that task is, with the record
it runs (`Runner.record`, set by the dispatcher anyway). One WARNING per stall, with
that job's fields and `blocked_s`, counted for its type; an INFO line when the loop is
back, with how long the stall lasted in all. A stall in no runner's task (no handler
running) is reported without a job, and counted for every type on the loop.

`StallClock` is the decision, pure; `LoopMonitor` is the timer and the thread of one
loop; `LoopWatch` is a worker's part in it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from stream_jobs.record import HEADER_ATTEMPT, HEADER_JOB_ID, HEADER_TYPE, Record
from stream_jobs.runtime.dispatch import Runner

log = logging.getLogger("stream_jobs.worker")

# A loop late by more than this is reported (it has stalled fetches and heartbeats).
STALL_WARNING_S = 1.0
# How often the loop refreshes its timestamp and the thread looks at it. A stall is
# reported once the loop is `STALL_WARNING_S` late, seen within a tick: every stall of
# STALL_WARNING_S + 2 ticks (1.2 s) or more is reported, and shorter ones may be.
TICK_S = 0.1


@dataclass(frozen=True, slots=True)
class Stalled:
    """The loop has been blocked for `blocked_s` so far (reported once per stall)."""

    blocked_s: float


@dataclass(frozen=True, slots=True)
class Recovered:
    """The loop ran again after a reported stall that lasted `blocked_s` in all."""

    blocked_s: float


class StallClock:
    """Whether the loop is stalled, from the last time it ticked. Pure: times are given.

    The loop ticks every `tick_s`, so it is `now - beat - tick_s` late; past
    `warn_after_s` a stall is reported once (`Stalled`), and the next tick after it ends
    the stall (`Recovered`, its length measured to that tick).
    """

    def __init__(self, *, warn_after_s: float = STALL_WARNING_S, tick_s: float = TICK_S) -> None:
        self.warn_after_s = warn_after_s
        self.tick_s = tick_s
        self._stalled_beat: float | None = None  # the beat a reported stall began after

    def observe(self, beat: float, now: float) -> Stalled | Recovered | None:
        """What to report, seeing the loop's last tick at `beat` at time `now`."""
        if self._stalled_beat is not None:
            if beat == self._stalled_beat:
                return None  # still the same stall, already reported
            began = self._stalled_beat + self.tick_s
            self._stalled_beat = None
            # The tick that ended it ran at `beat`; the loop was due at `began`.
            return Recovered(max(0.0, beat - began))
        late = now - beat - self.tick_s
        if late > self.warn_after_s:
            self._stalled_beat = beat
            return Stalled(late)
        return None


def job_fields_of(record: Record) -> dict[str, Any]:
    """The log fields of the job a record holds, read from its headers (a stall is
    reported from another thread, so nothing of the runner's decoded job is read)."""
    found: dict[str, str] = {}
    for name, value in record.headers or ():
        if name in (HEADER_JOB_ID, HEADER_TYPE, HEADER_ATTEMPT):
            found[name] = bytes(value).decode(errors="replace")
    fields: dict[str, Any] = {"topic": record.topic, "partition": record.partition,
                              "offset": record.offset}
    if HEADER_TYPE in found:
        fields["job_type"] = found[HEADER_TYPE]
    if HEADER_JOB_ID in found:
        fields["job_id"] = found[HEADER_JOB_ID]
    attempt = found.get(HEADER_ATTEMPT, "")
    if attempt.isdigit():
        fields["attempt"] = int(attempt)
    return fields


def running_record(task: object, runners: Iterable[Runner]) -> Record | None:
    """The record `task` is running, if it is one of `runners` and is between no records."""
    for runner in runners:
        if runner.task is task and runner.work is not None:
            return runner.record
    return None


class LoopWatch:
    """A worker's part in the stall watch of its event loop (see the module): `runners`
    returns the worker's runners now (called on the monitor thread while the loop is
    blocked); `stalls` counts the stalls its jobs caused, and those no job is named for.
    `start` joins the loop's `LoopMonitor` (starting it, with this watch's `warn_after_s`
    and `tick_s`, for the first worker on the loop), `stop` leaves it (stopping it after
    the last). `name` is the worker's (its group)."""

    def __init__(self, name: str, runners: Callable[[], Iterable[Runner]], *,
                 warn_after_s: float = STALL_WARNING_S, tick_s: float = TICK_S) -> None:
        self.name = name
        self.runners = runners
        self._warn_after_s = warn_after_s
        self._tick_s = tick_s
        self._monitor: LoopMonitor | None = None
        # Stalls counted for this worker (a counter, for Prometheus).
        self.stalls = 0

    def start(self) -> None:
        """Watch the running loop with every other worker on it."""
        loop = asyncio.get_running_loop()
        with _monitors_lock:
            monitor = _monitors.get(loop)
            if monitor is None:
                monitor = _monitors[loop] = LoopMonitor(
                    loop, warn_after_s=self._warn_after_s, tick_s=self._tick_s)
                monitor.start()
            monitor.attach(self)
        self._monitor = monitor

    def stop(self) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return
        with _monitors_lock:
            if monitor.detach(self):
                monitor.stop()
                if _monitors.get(monitor.loop) is monitor:
                    del _monitors[monitor.loop]


# The monitor of each loop that has a started `LoopWatch`: one per process in practice.
_monitors: dict[asyncio.AbstractEventLoop, LoopMonitor] = {}
_monitors_lock = threading.Lock()


class LoopMonitor:
    """The timer and the thread that watch one event loop for every worker on it, so a
    stall is reported once, naming the job that caused it (see the module)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *,
                 warn_after_s: float = STALL_WARNING_S, tick_s: float = TICK_S) -> None:
        self.loop = loop
        self._clock = StallClock(warn_after_s=warn_after_s, tick_s=tick_s)
        self._tick_s = tick_s
        self._beat = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Replaced, never changed in place: the thread reads it while the loop may not run.
        self._watches: tuple[LoopWatch, ...] = ()
        self._blamed: dict[str, Any] = {}  # the fields of the job the last stall named

    def attach(self, watch: LoopWatch) -> None:
        self._watches = (*self._watches, watch)

    def detach(self, watch: LoopWatch) -> bool:
        """Forget `watch`; whether none is left."""
        self._watches = tuple(w for w in self._watches if w is not watch)
        return not self._watches

    def start(self) -> None:
        """Start ticking on the loop (the running one) and watching from a daemon thread."""
        self._beat = time.monotonic()
        self._timer = self.loop.call_later(self._tick_s, self._tick)
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="stream-jobs-loop-watch")
        self._thread.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self._tick_s)
            self._thread = None

    def _tick(self) -> None:
        self._beat = time.monotonic()
        self._timer = self.loop.call_later(self._tick_s, self._tick)

    def _watch(self) -> None:
        while not self._stop.wait(self._tick_s):
            event = self._clock.observe(self._beat, time.monotonic())
            if isinstance(event, Stalled):
                self._report(event.blocked_s)
            elif isinstance(event, Recovered):
                blamed, self._blamed = self._blamed, {}
                by = (f" (job {blamed.get('job_id', '?')}, {blamed.get('job_type', '?')})"
                      if blamed else "")
                log.info("the event loop ran again after %.1f s blocked%s", event.blocked_s,
                         by, extra={**blamed, "blocked_s": round(event.blocked_s, 3)})

    def _report(self, blocked_s: float) -> None:
        task = asyncio.current_task(self.loop)
        watches = self._watches
        for watch in watches:
            # A C-level copy: atomic under the GIL, while the loop's thread may wake.
            record = running_record(task, list(watch.runners()))
            if record is not None:
                watch.stalls += 1
                self._blamed = fields = job_fields_of(record)
                log.warning("job %s (%s) has blocked the event loop for %.1f s: an `async "
                            "def` handler must not block (time.sleep, sync I/O); fetches, "
                            "commits and group heartbeats wait meanwhile. Await instead, or "
                            "make it a plain `def`, which runs on a thread",
                            fields.get("job_id", "?"), fields.get("job_type", "?"),
                            blocked_s, extra={**fields, "blocked_s": round(blocked_s, 3)})
                return
        for watch in watches:  # no job to blame: every type of the loop waited
            watch.stalls += 1
        name = task.get_name() if task is not None else "no task"
        log.warning("the event loop has been blocked for %.1f s (in %s), not by a job's "
                    "handler: fetches, commits and group heartbeats wait meanwhile",
                    blocked_s, name, extra={"blocked_s": round(blocked_s, 3)})
