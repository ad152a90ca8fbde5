"""The idle watch of one process (`stream_jobs.runtime.idle`), on fake types. No services.

A fake type has a lane (a list), takes one job a poll and runs it as a task; a job may
write another type's job through a fake outbox, whose relay moves a row to its lane a
few polls later (the lane first, then the row deleted, as the real relay acknowledges
before it deletes). The watch must return only once every job, those written late by
another type's handler included, has run; and a check must notice a job that came in
while it was asking the outbox and the brokers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

import pytest

from stream_jobs.runtime import agreement, idle
from stream_jobs.runtime.idle import IdleLink, IdleWatch, run_until_idle

Job = Callable[[], Awaitable[None]]


async def polls(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class FakeType:
    def __init__(self, job_type: str) -> None:
        self.job_type = job_type
        self.lane: list[Job] = []
        self.taken = 0
        self.running = 0
        self.ran = 0
        self.stopping = asyncio.Event()
        self.empty_poll = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    def busy(self) -> bool:
        return self.running > 0

    def intake(self) -> int:
        return self.taken

    async def drained(self) -> bool:
        await polls(1)  # a round trip to the broker
        return not self.lane

    async def run(self) -> None:
        while not self.stopping.is_set():
            if self.lane:
                job = self.lane.pop(0)
                self.taken += 1
                self.running += 1
                task = asyncio.create_task(self._handle(job))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            else:
                self.empty_poll.set()
            await polls(1)

    async def _handle(self, job: Job) -> None:
        try:
            await job()
            self.ran += 1
        finally:
            self.running -= 1


class FakeOutbox:
    """Rows for lanes, moved by a relay task a few polls after they are written."""

    def __init__(self, delay_polls: int) -> None:
        self.rows: list[tuple[FakeType, Job]] = []
        self.delay_polls = delay_polls
        self.closed = False

    def write(self, into: FakeType, job: Job) -> None:
        self.rows.append((into, job))
        asyncio.get_running_loop().create_task(self._relay())

    async def _relay(self) -> None:
        await polls(self.delay_polls)
        into, job = self.rows[0]
        into.lane.append(job)  # acknowledged by the broker ...
        self.rows.pop(0)  # ... then deleted

    async def rows_waiting(self) -> int:
        await polls(1)  # a round trip to Postgres
        return len(self.rows)

    async def close(self) -> None:
        self.closed = True


class OutboxProbe:
    """What the watch asks (`OutboxWaiting`'s face) of a `FakeOutbox`."""

    def __init__(self, outbox: FakeOutbox) -> None:
        self.outbox = outbox

    async def rows(self) -> int:
        return await self.outbox.rows_waiting()

    async def close(self) -> None:
        await self.outbox.close()


async def drain(types: list[FakeType], watch: IdleWatch) -> None:
    async def work() -> None:
        await asyncio.gather(*(t.run() for t in types))

    def stop() -> None:
        for t in types:
            t.stopping.set()

    await asyncio.wait_for(run_until_idle(watch, work, stop), 10)


async def test_a_callback_written_late_into_an_idle_type_is_waited_for() -> None:
    members, report = FakeType("album.photo"), FakeType("album.report")
    outbox = FakeOutbox(delay_polls=30)

    async def callback() -> None:
        await polls(3)

    async def member() -> None:
        await polls(20)  # long after album.report's lanes were first found empty
        outbox.write(report, callback)  # in the transaction that finishes the member

    members.lane.append(member)
    watch = IdleWatch([members, report], outbox=OutboxProbe(outbox))  # type: ignore[arg-type]
    await drain([members, report], watch)
    assert (members.ran, report.ran) == (1, 1)
    assert watch.checks > 1  # it found them busy, or the row waiting, before
    assert outbox.closed


async def test_a_chain_across_three_types_written_directly_is_waited_for() -> None:
    steps = [FakeType("video.fetch"), FakeType("video.transcode"), FakeType("video.publish")]

    def step(i: int) -> Job:
        async def run() -> None:
            await polls(10)
            if i + 1 < len(steps):
                steps[i + 1].lane.append(step(i + 1))  # written before the job finishes
        return run

    steps[0].lane.append(step(0))
    await drain(steps, IdleWatch(steps))  # type: ignore[arg-type]
    assert [s.ran for s in steps] == [1, 1, 1]


async def test_without_the_outbox_in_the_check_the_callback_would_be_missed() -> None:
    # The same as the first test with the outbox left out of the check: what the old
    # per-type check did. It returns with the row still waiting, so the check above
    # is what waits for it.
    members, report = FakeType("album.photo"), FakeType("album.report")
    outbox = FakeOutbox(delay_polls=30)

    async def member() -> None:
        await polls(5)
        outbox.write(report, polls_job)

    async def polls_job() -> None:
        await polls(1)

    members.lane.append(member)
    await drain([members, report], IdleWatch([members, report]))  # type: ignore[arg-type]
    assert report.ran == 0
    assert outbox.rows


async def test_a_job_that_comes_in_during_a_check_makes_it_fail() -> None:
    quiet, late = FakeType("a.quiet"), FakeType("b.late")

    async def drained_while_a_job_comes_in() -> bool:
        late.taken += 1  # fetched while the check waited for the broker
        return True

    late.drained = drained_while_a_job_comes_in  # type: ignore[method-assign]
    watch = IdleWatch([quiet, late])  # type: ignore[list-item]
    assert await watch.check() == "jobs that came in"
    reading = await IdleWatch([quiet]).check()  # type: ignore[list-item]
    assert reading == (0,)
    quiet.taken += 1
    assert await IdleWatch([quiet]).check(since=(0,)) == "jobs that came in"  # type: ignore[list-item]


async def test_a_busy_type_is_named_and_a_long_wait_is_told(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(idle, "TELL_EVERY_S", 0.0)
    held = FakeType("mail.send")
    held.running = 1  # a retry held in its delay tier
    watch = IdleWatch([held])  # type: ignore[list-item]
    assert await watch.check() == "mail.send: jobs running or held in a delay tier"
    running = asyncio.create_task(watch.wait())
    with caplog.at_level(logging.INFO, "stream_jobs.idle"):
        for _ in range(3):
            held.empty_poll.set()
            await polls(5)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert ("--until-idle: still waiting for mail.send: jobs running or held in a delay "
            "tier") in caplog.text


async def test_a_child_says_idle_answers_questions_and_says_busy() -> None:
    mine, supervisor = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    supervisor.setblocking(False)
    kind = FakeType("a.type")
    watch = IdleWatch([kind], link=IdleLink(mine.detach()))  # type: ignore[list-item]
    running = asyncio.create_task(watch.wait())

    async def heard() -> bytes:
        while True:
            kind.empty_poll.set()  # the type keeps polling, finding nothing
            try:
                return supervisor.recv(64)
            except BlockingIOError:
                await polls(1)

    try:
        assert await heard() == agreement.IDLE
        supervisor.send(agreement.confirm(1))
        assert await heard() == agreement.still(1)
        kind.taken += 1  # a job came in (and finished)
        assert await heard() == agreement.BUSY
        assert await heard() == agreement.IDLE  # a new quiet spell
        assert not running.done()  # a child never stops by itself
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        supervisor.close()
