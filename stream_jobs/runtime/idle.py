"""The drain primitive: when a worker process has nothing left to do (`--until-idle`).

A process is idle when no type it runs has a job in a lane, a delay tier, the outbox or
a handler. Each type's runner (a `Worker`, a `Shadow`) shows the watch three things:

- `intake()`: records fetched from its lanes and tiers, and rebalances, so far. It only
  grows, so two equal readings mean nothing came in between;
- `busy()`: work in memory: jobs fetched and not finished (a record a delay tier holds
  until it is due among them), handlers still running on a thread;
- `drained()`: its partitions read to their ends and committed.

One check reads every runner's `busy()` and `intake()` at one instant (they share the
event loop: no await between them), then asks the outbox how many rows for the
process's types wait, then each runner whether it is drained, then reads `busy()` and
`intake()` again. If nothing came in between the two readings, no handler ran in that
interval, so nothing in the process could write a job. A row in the outbox at the first
reading was either still there when asked (not idle), or a relay had it acknowledged by
Kafka before deleting it, so the lanes were read to their ends after it arrived. So the
process was idle at the second reading, and stays so: nothing in it runs without
fetching something first. No quiet period is slept; one consistent check is the proof.
The checks are paced by the runners' own polls: one starts when every runner has had a
poll that fetched nothing since the last check (a poll waits up to 200 ms for records).

A job in a delay tier is waited for, due or not: it is held in memory (busy) or unread
in its tier (not drained). A retry due in 5 s keeps the process 5 s more; a job enqueued
with `delay=` an hour keeps it an hour, and the process says every 30 s what it waits
for. Exiting with a job held would leave the very work `--until-idle` promises to do.
A type's schedules are not waited for: a firing after the process stopped runs when a
worker runs again.

With `--processes N`, one process's check cannot see the others: a job written by a
handler in one child may be for a partition another child reads. Each child then runs
the same checks, tells its supervisor through an `IdleLink`, answers its questions, and
keeps running until the supervisor, once all agree (`stream_jobs.runtime.agreement`),
stops them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from stream_jobs.errors import StreamJobsError
from stream_jobs.outbox.depth import OutboxWaiting
from stream_jobs.runtime import agreement

log = logging.getLogger("stream_jobs.idle")

# How often a process that keeps waiting says what for.
TELL_EVERY_S = 30.0

# Each runner's intake at a moment when none was busy.
Reading = tuple[int, ...]


class Drainable(Protocol):
    """What the watch reads of one type's runner."""

    job_type: str
    # Set by the runner after a poll that fetched nothing: it paces the checks.
    empty_poll: asyncio.Event

    def busy(self) -> bool: ...

    def intake(self) -> int: ...

    async def drained(self) -> bool: ...


class IdleLink:
    """A child's end of its socket to the supervisor (`Child.idle_link`): it says `idle`,
    `busy` and `still R`, and hears the supervisor's `confirm R` questions."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._asked: asyncio.Queue[int] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None

    def send(self, message: bytes) -> None:
        with contextlib.suppress(OSError):  # the supervisor is gone: the lifeline stops us
            self._sock.send(message)

    async def asked(self) -> int:
        """The round of the supervisor's next question."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._sock.fileno(), self._readable)
        return await self._asked.get()

    def _readable(self) -> None:
        while True:
            try:
                message = self._sock.recv(64, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:  # the supervisor is gone: nobody asks any more
                self._stop_reading()
                return
            round_no = agreement.confirm_round(message)
            if round_no is not None:
                self._asked.put_nowait(round_no)

    def _stop_reading(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop = None

    def close(self) -> None:
        self._stop_reading()
        self._sock.close()


class IdleWatch:
    """Decides when the runners of one process (and, with a link, of all the processes
    of a supervisor) are idle together; see the module's docstring."""

    def __init__(self, runners: Sequence[Drainable], *, outbox: OutboxWaiting | None = None,
                 link: IdleLink | None = None) -> None:
        self.runners = list(runners)
        self.outbox = outbox
        self.link = link
        self.checks = 0
        self._told: tuple[str, float] | None = None  # what it waits for, since when

    async def wait(self) -> None:
        """Return once the process is idle. With a link it does not return: it tells the
        supervisor and answers its questions until the supervisor stops the process."""
        try:
            while True:
                reading = await self._quiet()
                if self.link is None:
                    return
                await self._report(reading)
        finally:
            if self.outbox is not None:
                await self.outbox.close()
            if self.link is not None:
                self.link.close()

    async def check(self, since: Reading | None = None) -> Reading | str:
        """One consistent check: the runners' reading if the process is idle (and, given
        `since`, nothing came in since that reading), else what it waits for."""
        self.checks += 1
        before = self._read()
        if isinstance(before, str):
            return before
        if since is not None and before != since:
            return "jobs that came in"
        if self.outbox is not None:
            try:
                rows = await self.outbox.rows()
            except StreamJobsError as exc:
                return f"Postgres, to ask about the outbox ({exc})"
            if rows:
                return f"{rows} outbox row{'s' if rows > 1 else ''} of its types"
        # At once: each asks the broker for its partitions' ends, which can wait behind
        # its consumer's fetch in flight (up to 500 ms).
        drained = await asyncio.gather(*(runner.drained() for runner in self.runners))
        for runner, done in zip(self.runners, drained, strict=True):
            if not done:
                return f"{runner.job_type}: its lanes and delay tiers read to their ends"
        return before if self._read() == before else "jobs that came in"

    def _read(self) -> Reading | str:
        for runner in self.runners:
            if runner.busy():
                return f"{runner.job_type}: jobs running or held in a delay tier"
        return tuple(runner.intake() for runner in self.runners)

    async def _quiet(self) -> Reading:
        """The reading of the next check that finds the process idle."""
        while True:
            await self._polled()
            found = await self.check()
            if not isinstance(found, str):
                self._told = None
                return found
            self._tell(found)

    async def _polled(self) -> None:
        """Until every runner has had a poll that fetched nothing, from now."""
        for runner in self.runners:
            runner.empty_poll.clear()
        await asyncio.gather(*(runner.empty_poll.wait() for runner in self.runners))

    async def _report(self, reading: Reading) -> None:
        """Say `idle`, then answer the supervisor's questions while nothing comes in; say
        `busy` and return once something does."""
        link = self.link
        assert link is not None
        link.send(agreement.IDLE)
        while True:
            asked = await self._polled_or_asked(link)
            if asked is None:
                if self._read() == reading:
                    continue
            elif not isinstance(await self.check(since=reading), str):
                link.send(agreement.still(asked))
                continue
            link.send(agreement.BUSY)
            return

    async def _polled_or_asked(self, link: IdleLink) -> int | None:
        """The round the supervisor asks about, or None after the runners' next polls."""
        polled = asyncio.ensure_future(self._polled())
        asked = asyncio.ensure_future(link.asked())
        try:
            await asyncio.wait({polled, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (polled, asked):
                task.cancel()
            await asyncio.gather(polled, asked, return_exceptions=True)
        return asked.result() if asked.done() and not asked.cancelled() else None

    def _tell(self, waiting_for: str) -> None:
        now = asyncio.get_running_loop().time()
        if self._told is None:
            self._told = (waiting_for, now)
        elif now - self._told[1] >= TELL_EVERY_S:
            log.info("--until-idle: still waiting for %s", waiting_for)
            self._told = (waiting_for, now)


async def run_until_idle(watch: IdleWatch, work: Callable[[], Awaitable[None]],
                         stop: Callable[[], None]) -> None:
    """Run `work` until `watch` finds the process idle, then `stop()` it and wait for it
    to drain. `work` ending first (stopped by a signal, or failed) ends the watch; an
    error of either is raised."""
    running = asyncio.ensure_future(work())
    watching = asyncio.ensure_future(watch.wait())
    try:
        await asyncio.wait({running, watching}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            stop()
            await asyncio.wait({running})
        running.result()
        if watching.done() and not watching.cancelled():
            watching.result()
    finally:
        for task in (running, watching):
            task.cancel()
        await asyncio.gather(running, watching, return_exceptions=True)


__all__ = ["TELL_EVERY_S", "Drainable", "IdleLink", "IdleWatch", "Reading", "run_until_idle"]
