"""The blocked-loop warning: an `async def` handler that blocks the event loop (a
`time.sleep`, a sync driver call) for more than a second is logged with its job.

While the loop is blocked nothing else of the worker runs: no fetch, no commit, no
heartbeat to the consumer group (miss enough and the group evicts the worker), no other
job. The detector costs the job path nothing: the loop refreshes a timestamp from a timer
ten times a second, and a daemon thread compares it with the clock. When the loop is
late by more than `warn_after_s`, the thread asks which task the loop is running (the
running task of a loop is readable from any thread) and, when it is a runner, which
record that runner has (`Runner.record`, set by the dispatcher anyway): one WARNING per
stall, with the job's fields and `blocked_s`, and a second line when the loop is back,
with how long the stall lasted in all.

`StallClock` is the decision, pure; `LoopWatch` is the timer and the thread.
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
    """Warns about stalls of the running loop (see the module). `runners` returns the
    member's runners now; it is called on the monitor thread while the loop is blocked."""

    def __init__(self, name: str, runners: Callable[[], Iterable[Runner]], *,
                 warn_after_s: float = STALL_WARNING_S, tick_s: float = TICK_S) -> None:
        self.name = name
        self._runners = runners
        self._clock = StallClock(warn_after_s=warn_after_s, tick_s=tick_s)
        self._tick_s = tick_s
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Stalls reported (a counter, for Prometheus).
        self.stalls = 0

    def start(self) -> None:
        """Start ticking on the running loop and watching from a daemon thread."""
        self._loop = asyncio.get_running_loop()
        self._beat = time.monotonic()
        self._timer = self._loop.call_later(self._tick_s, self._tick)
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"{self.name}-loop-watch")
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
        assert self._loop is not None
        self._timer = self._loop.call_later(self._tick_s, self._tick)

    def _watch(self) -> None:
        while not self._stop.wait(self._tick_s):
            event = self._clock.observe(self._beat, time.monotonic())
            if isinstance(event, Stalled):
                self.stalls += 1
                self._report(event.blocked_s)
            elif isinstance(event, Recovered):
                log.warning("%s: the event loop ran again after %.1f s blocked", self.name,
                            event.blocked_s, extra={"blocked_s": round(event.blocked_s, 3)})

    def _report(self, blocked_s: float) -> None:
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        # A C-level copy: atomic under the GIL, while the loop's thread may wake and change it.
        record = running_record(task, list(self._runners()))
        if record is None:
            name = task.get_name() if task is not None else "no task"
            log.warning("%s: the event loop has been blocked for %.1f s (in %s): fetches, "
                        "commits and group heartbeats wait meanwhile", self.name, blocked_s,
                        name, extra={"blocked_s": round(blocked_s, 3)})
            return
        fields = job_fields_of(record)
        log.warning("job %s (%s) has blocked the event loop for %.1f s: an `async def` "
                    "handler must not block (time.sleep, sync I/O); fetches, commits and "
                    "group heartbeats wait meanwhile. Await instead, or make it a plain "
                    "`def`, which runs on a thread", fields.get("job_id", "?"),
                    fields.get("job_type", "?"), blocked_s,
                    extra={**fields, "blocked_s": round(blocked_s, 3)})
