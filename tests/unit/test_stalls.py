"""The blocked-loop warning without services: the stall decision (pure, property-tested)
and the monitor thread naming the job a runner blocks the loop with."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.logs import fields
from stream_jobs.record import Record
from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.stalls import (
    LoopWatch,
    Recovered,
    StallClock,
    Stalled,
    job_fields_of,
    running_record,
)

from .fake_records import FakeRecord
from .test_runners import Member, feed, until

TICK = 0.25



def watch_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The watch's log lines only: asyncio's "Unclosed AIOKafkaProducer" from an earlier
    test's garbage may be collected (and logged) while a test here runs."""
    return [r for r in caplog.records if r.name.startswith("stream_jobs")]

def test_a_stall_is_reported_once_and_its_end_with_its_whole_length() -> None:
    clock = StallClock(warn_after_s=1.0, tick_s=TICK)
    assert clock.observe(beat=10.0, now=10.2) is None  # between two ticks
    assert clock.observe(beat=10.0, now=11.2) is None  # 0.95 s late: not yet
    assert clock.observe(beat=10.0, now=11.5) == Stalled(1.25)
    assert clock.observe(beat=10.0, now=14.0) is None  # the same stall, reported already
    # The loop ticked again at 14.1: it was due at 10.25, so 3.85 s were lost.
    recovered = clock.observe(beat=14.1, now=14.2)
    assert isinstance(recovered, Recovered)
    assert recovered.blocked_s == pytest.approx(3.85)
    assert clock.observe(beat=14.1, now=14.3) is None


@given(st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 0.3)), min_size=1,
                max_size=40))
def test_each_stall_is_reported_once_and_recovers_before_the_next(
        steps: list[tuple[float, float]]) -> None:
    """The loop ticks with gaps (`gap` seconds late each time); the monitor looks every
    `look` seconds (at most 0.3) between ticks. A stall is reported at most once per gap
    over the threshold, always when the gap outlasts the threshold by two looks, and each
    report is followed by one Recovered at the next tick; no gap under it reports."""
    clock = StallClock(warn_after_s=1.0, tick_s=TICK)
    beat = now = 0.0
    events: list[object] = []
    for gap, look in steps:
        due = beat + TICK + gap  # the next tick runs this late
        while now + max(look, 0.05) < due:  # looks before the loop ticks again
            now += max(look, 0.05)
            event = clock.observe(beat, now)
            if event is not None:
                events.append(event)
        beat = now = due
        event = clock.observe(beat, now)
        if event is not None:
            events.append(event)
    kinds = [type(e) for e in events]
    assert kinds == [Stalled, Recovered] * (len(kinds) // 2)
    gaps = [gap for gap, _ in steps]
    assert sum(g > 1.6 for g in gaps) <= kinds.count(Stalled) <= sum(g > 1.0 for g in gaps)
    for stalled in events[::2]:
        assert isinstance(stalled, Stalled)
        assert stalled.blocked_s > 1.0


def test_a_records_job_fields_come_from_its_headers() -> None:
    record = FakeRecord("jobs.pdf.render", 3, 41, headers=[
        ("sj-job-id", b"01a2"), ("sj-type", b"pdf.render"), ("sj-attempt", b"2"),
        ("traceparent", b"00-x")])
    assert job_fields_of(record) == {"topic": "jobs.pdf.render", "partition": 3,
                                     "offset": 41, "job_type": "pdf.render",
                                     "job_id": "01a2", "attempt": 2}
    assert job_fields_of(FakeRecord("t", 0, 1, headers=[("sj-attempt", b"x")])) == {
        "topic": "t", "partition": 0, "offset": 1}
    runner = Runner(task=None)
    assert running_record(None, [runner]) is None  # between records (work is None)


def tag(work: PartitionWork, job_type: bytes) -> None:
    """Give each fed record the headers a job has (its ID is "j-OFFSET")."""
    for chain in work.chains.values():
        record = chain.records[0]
        record.headers = [("sj-job-id", b"j-%d" % record.offset), ("sj-type", job_type)]


async def test_a_handler_blocking_the_loop_is_named_in_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    async def handle(member: Member, work: PartitionWork, record: Record,
                     runner: Runner) -> None:
        if record.offset == 1:
            time.sleep(0.6)  # noqa: ASYNC251 (the mistake the warning is for)

    member = Member(handle, concurrency=2)
    watch = LoopWatch("g", lambda: member.dispatcher.runners, warn_after_s=0.3, tick_s=0.05)
    watch.start()
    try:
        with caplog.at_level(logging.INFO, logger="stream_jobs.worker"):
            tag(feed(member, 0, [None, None, None]), b"pdf.render")
            await until(lambda: len(member.done) == 3, "all records finish")
            await until(lambda: len(watch_lines(caplog)) >= 2,
                        "the stall and its end are logged")
    finally:
        watch.stop()
    stalled, ended = watch_lines(caplog)[:2]
    assert stalled.levelno == logging.WARNING
    assert "job j-1 (pdf.render) has blocked the event loop" in stalled.getMessage()
    assert fields(stalled)["job_id"] == "j-1"
    assert fields(stalled)["offset"] == 1
    assert fields(stalled)["blocked_s"] >= 0.3
    # The stall's end is not a second warning; it names the same job.
    assert ended.levelno == logging.INFO
    assert "ran again after" in ended.getMessage()
    assert "(job j-1, pdf.render)" in ended.getMessage()
    assert 0.4 <= fields(ended)["blocked_s"] < 3
    assert watch.stalls == 1


async def test_workers_on_one_loop_share_one_watch_that_blames_only_the_blocker(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 22: each type's worker had a watch of its own, so one stall was reported by
    every worker of the process, the innocent ones too."""
    async def blocks(member: Member, work: PartitionWork, record: Record,
                     runner: Runner) -> None:
        if record.offset == 1:
            time.sleep(1.2)  # noqa: ASYNC251 (the mistake the warning is for)

    async def awaits(member: Member, work: PartitionWork, record: Record,
                     runner: Runner) -> None:
        await asyncio.sleep(0)

    members = {b"pdf.render": Member(blocks, concurrency=2),
               **{b"mail.%d" % n: Member(awaits, concurrency=2) for n in range(3)}}
    watches = [LoopWatch(kind.decode(), lambda m=m: m.dispatcher.runners,  # type: ignore[misc]
                         warn_after_s=0.6, tick_s=0.05) for kind, m in members.items()]
    threads = threading.active_count()
    for watch in watches:
        watch.start()
    watching = threading.active_count() - threads
    try:
        with caplog.at_level(logging.INFO, logger="stream_jobs.worker"):
            for kind, member in members.items():
                tag(feed(member, 0, [None, None, None]), kind)
            await until(lambda: all(len(m.done) == 3 for m in members.values()),
                        "all records finish")
            await until(lambda: len(watch_lines(caplog)) >= 2,
                        "the stall and its end are logged")
    finally:
        for watch in watches:
            watch.stop()
    ours = watch_lines(caplog)
    warnings = [r for r in ours if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].getMessage().startswith("job j-1 (pdf.render) has blocked the event loop")
    assert len([r for r in ours if "ran again" in r.getMessage()]) == 1
    assert [w.stalls for w in watches] == [1, 0, 0, 0]
    assert watching == 1  # one monitor thread for the loop, gone with its last watch
    assert threading.active_count() == threads
