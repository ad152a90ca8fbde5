"""JobTester runs an app's real job path in memory: successes, retries through the tiers
on virtual time, dead letters with their reasons, expiry, bad records, duplicates, key
order and timeouts, with no broker and no waiting for a tier's delay."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from stream_jobs import App, JobContext, PermanentError, clock
from stream_jobs.errors import ConfigError, LetterNotFound, NotSettled, UnknownJobType
from stream_jobs.kafka.clients import AIOKAFKA
from stream_jobs.record import JobRecord
from stream_jobs.testing import JobTester
from stream_jobs.testing.plugin import StartTester

TYPES: dict[str, Any] = {"mail.send": {"partitions": 3, "retry_tiers": ["5s", "1m", "10m"],
                                       "max_attempts": 4}}


class Mail(BaseModel):
    to: str
    subject: str = "hi"


def mail_app(ran: list[tuple[str, int]] | None = None, **job: Any) -> App:
    app = App()

    @app.job("mail.send", **job)
    async def send(mail: Mail, ctx: JobContext) -> None:
        if ran is not None:
            ran.append((mail.to, ctx.attempt))
        if mail.to == "nobody":
            raise PermanentError("no such address")
        if mail.subject == "always" or (mail.subject == "flaky" and ctx.attempt < 3):
            raise RuntimeError("mail server busy")
        if mail.subject == "slow":
            await asyncio.sleep(30)
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO sent VALUES ($1, $2)", ctx.job_id, mail.to)

    return app


async def test_a_retry_waits_on_virtual_time_not_the_tiers_delay(
        job_tester: StartTester) -> None:
    t = job_tester(mail_app(), types=TYPES)
    began, real = t.now, time.monotonic()
    flaky = await t.enqueue("mail.send", Mail(to="a@b.c", subject="flaky"))
    await t.run_until_idle()
    assert t.outcomes == {"retried": 2, "succeeded": 1}
    assert t.attempts_of(flaky) == 3
    # Two tiers' delays (5 s and 1 min) passed on the clock, none of them in real time.
    assert (t.now - began).total_seconds() >= 65
    assert time.monotonic() - real < 10
    assert t.effects_of(flaky)[0].args == (flaky, "a@b.c")


async def test_a_job_that_always_fails_is_dead_lettered_after_max_attempts(
        job_tester: StartTester) -> None:
    t = job_tester(mail_app(), types=TYPES)
    doomed = await t.enqueue("mail.send", {"to": "a@b.c", "subject": "always"})
    nobody = await t.enqueue("mail.send", {"to": "nobody"})
    await t.run_until_idle()
    assert t.outcomes == {"retried": 3, "dead_lettered": 2}
    assert t.dead_letter_reasons == {"max-attempts": 1, "permanent": 1}
    letter = t.letter_of(doomed)
    assert (letter.reason, letter.attempt) == ("max-attempts", 4)
    assert letter.failure is not None
    assert letter.failure.message == "mail server busy"
    assert letter.job is not None
    assert orjson.loads(letter.job.payload)["subject"] == "always"
    assert t.letter_of(nobody).reason == "permanent"
    assert t.effects_of(doomed) == []
    with pytest.raises(LetterNotFound):
        t.letter_of("no-such-job")


async def test_without_jumps_a_retry_waits_in_its_tier_until_the_clock_gets_there(
        job_tester: StartTester) -> None:
    ran: list[tuple[str, int]] = []
    t = job_tester(mail_app(ran), types=TYPES)
    await t.enqueue("mail.send", {"to": "a@b.c", "subject": "flaky"})
    await t.run_until_idle(jump=False)
    assert ran == [("a@b.c", 1)]
    await t.advance(4)
    assert ran == [("a@b.c", 1)]  # tier 5s: not before 5 s (plus jitter) have passed
    await t.advance(2)
    assert ran == [("a@b.c", 1), ("a@b.c", 2)]
    await t.advance(70)
    assert ran[-1] == ("a@b.c", 3)
    assert t.outcomes == {"retried": 2, "succeeded": 1}


async def test_a_delayed_job_runs_when_its_time_comes(job_tester: StartTester) -> None:
    ran: list[tuple[str, int]] = []
    t = job_tester(mail_app(ran), types=TYPES)
    await t.enqueue("mail.send", {"to": "later@b.c"}, delay=90)
    await t.advance(60)
    assert ran == []
    await t.run_until_idle()
    assert ran == [("later@b.c", 1)]
    assert t.outcomes == {"succeeded": 1}


async def test_a_job_past_its_expiry_is_not_run(job_tester: StartTester) -> None:
    ran: list[tuple[str, int]] = []
    t = job_tester(mail_app(ran), types=TYPES)
    await t.enqueue("mail.send", {"to": "a@b.c"}, expires_in=60)
    fresh = await t.enqueue("mail.send", {"to": "b@b.c"}, expires_in=3600)
    t.move_clock(61)  # no worker ran meanwhile
    await t.run_until_idle()
    assert t.outcomes == {"expired": 1, "succeeded": 1}
    assert ran == [("b@b.c", 1)]
    assert list(t.done) == [fresh]


async def test_bad_records_are_dead_lettered_with_their_reason(job_tester: StartTester) -> None:
    t = job_tester(mail_app(), types=TYPES)
    t.send_raw("mail.send", b"not json at all", key=b"k")
    job = JobRecord("bad-1", "mail.send", b"{broken", b"bad-1")
    t.send_raw("mail.send", job.payload, key=job.key, headers=job.headers())
    misfit = JobRecord("bad-2", "mail.send", b'{"subject": 3}', b"bad-2")
    t.send_raw("mail.send", misfit.payload, key=misfit.key, headers=misfit.headers())
    await t.run_until_idle()
    assert t.outcomes == {"dead_lettered": 3}
    assert t.dead_letter_reasons == {"missing-header": 1, "bad-json": 1, "invalid-payload": 1}
    assert t.letter_of("bad-2").failure is not None
    with pytest.raises(ConfigError, match="no 'high' lane"):
        t.send_raw("mail.send", b"{}", lane="high")


async def test_a_second_job_with_the_same_id_is_a_duplicate(job_tester: StartTester) -> None:
    t = job_tester(mail_app(), types=TYPES)
    await t.enqueue("mail.send", {"to": "a@b.c"}, job_id="order-7")
    await t.run_until_idle()
    await t.enqueue("mail.send", {"to": "a@b.c"}, job_id="order-7")
    await t.run_until_idle()
    assert t.outcomes == {"succeeded": 1, "duplicate": 1}
    assert len(t.effects_of("order-7")) == 1


async def test_one_keys_jobs_run_in_order(job_tester: StartTester) -> None:
    ran: list[tuple[str, int]] = []
    t = job_tester(mail_app(ran, concurrency=8), types=TYPES)
    for n in range(30):
        await t.enqueue("mail.send", {"to": f"user-{n % 3}:{n}"}, key=f"user-{n % 3}")
    await t.run_until_idle()
    for user in range(3):
        seen = [int(to.split(":")[1]) for to, _ in ran if to.startswith(f"user-{user}:")]
        assert seen == sorted(seen)
        assert len(seen) == 10


async def test_a_handler_past_its_timeout_has_failed(job_tester: StartTester) -> None:
    t = job_tester(mail_app(timeout=0.05), types={"mail.send": {"max_attempts": 1}})
    await t.enqueue("mail.send", {"to": "a@b.c", "subject": "slow"})
    await t.run_until_idle()
    assert t.outcomes == {"dead_lettered": 1}
    [letter] = t.dead_letters
    assert letter.failure is not None
    assert letter.failure.error_class == "TimeoutError"


async def test_a_run_that_does_not_come_to_rest_says_which_job_runs(
        job_tester: StartTester) -> None:
    t = job_tester(mail_app(), types=TYPES, timeout_s=0.3)
    slow = await t.enqueue("mail.send", {"to": "a@b.c", "subject": "slow"})
    with pytest.raises(NotSettled, match=f"still running: job {slow} \\(mail.send\\) attempt 1"):
        await t.run_until_idle()


async def test_the_app_and_the_clock_are_given_back_on_close() -> None:
    app = mail_app()
    async with JobTester(app, types=TYPES, start=datetime(2030, 1, 1, tzinfo=UTC)) as t:
        assert app.kafka is not AIOKAFKA
        assert clock.now_ms() == t.clock.now_ms()
        async with app.client() as client:  # the app's own client enqueues into the tester
            await client.enqueue("mail.send", {"to": "a@b.c"})
        await t.run_until_idle()
        assert t.outcomes == {"succeeded": 1}
    assert app.kafka is AIOKAFKA
    assert abs(clock.now_ms() - time.time() * 1000) < 60_000


async def test_bad_input_is_refused_with_one_sentence(job_tester: StartTester) -> None:
    with pytest.raises(ConfigError, match="no handlers"):
        JobTester(App(), types=TYPES)
    with pytest.raises(ConfigError, match=r"'mail\.send' has a handler but is not declared"):
        JobTester(mail_app(), types={"other.type": {}})
    with pytest.raises(ConfigError, match="partitions"):
        JobTester(mail_app(), types={"mail.send": {"partitions": 0}})
    idle = JobTester(mail_app(), types=TYPES)
    with pytest.raises(ConfigError, match="Open the JobTester first"):
        await idle.enqueue("mail.send", {"to": "a@b.c"})
    t = job_tester(mail_app(), types=TYPES)
    with pytest.raises(ConfigError, match="Another virtual clock"):
        JobTester(mail_app(), types=TYPES).open()
    with pytest.raises(UnknownJobType):
        await t.enqueue("mail.sned", {"to": "a@b.c"})
    with pytest.raises(ConfigError, match="forward"):
        await t.advance(-1)
    assert t.outcomes == {}


async def test_a_record_held_for_long_does_not_hold_up_a_due_one(
        job_tester: StartTester) -> None:
    # The relay bug JobTester found (tests/integration/test_job_path_relay.py has it on the
    # real stack): while its runners held records, the relay started none for a head
    # fetched later on another partition, here the flaky job's retry behind the far job.
    ran: list[tuple[str, int]] = []
    t = job_tester(mail_app(ran), types=TYPES, timeout_s=5)
    await t.enqueue("mail.send", {"to": "far@b.c"}, delay=600)
    await t.enqueue("mail.send", {"to": "soon@b.c", "subject": "flaky"})
    await t.run_until_idle()
    assert ran == [("soon@b.c", 1), ("soon@b.c", 2), ("soon@b.c", 3), ("far@b.c", 1)]
