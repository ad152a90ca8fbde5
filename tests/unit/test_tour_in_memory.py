"""The README tour's handler (`consumers/mail.py`) under the `job_tester` fixture: the
same three jobs as tests/integration/test_tour.py runs on the real stack, with the tour's
own topics/email.send.toml (a 5 s first tier, waited for on virtual time only)."""

from __future__ import annotations

import time

from consumers import mail
from stream_jobs.testing.plugin import StartTester


async def test_the_tour_succeeds_retries_once_and_dead_letters_in_memory(
        job_tester: StartTester) -> None:
    t = job_tester(mail.app)
    began, real = t.now, time.monotonic()
    sent = await t.enqueue("email.send", mail.SendEmail(to="a@b.c", subject="hi"),
                           key="user-42", priority="high")
    flaky = await t.enqueue("email.send", {"to": "x@y.z", "subject": "flaky"})
    nobody = await t.enqueue("email.send", {"to": "nobody", "subject": "hi"})
    await t.run_until_idle()

    assert t.outcomes == {"succeeded": 2, "retried": 1, "dead_lettered": 1}
    assert (t.attempts_of(sent), t.attempts_of(flaky)) == (1, 2)
    insert = "INSERT INTO sent_emails (job_id, recipient) VALUES ($1, $2)"
    assert [(s.sql, s.args) for s in t.effects_of(sent)] == [(insert, (sent, "a@b.c"))]
    assert [s.args for s in t.effects_of(flaky)] == [(flaky, "x@y.z")]
    assert t.done[flaky].attempt == 2
    letter = t.letter_of(nobody)
    assert (letter.reason, letter.attempt) == ("permanent", 1)
    assert letter.failure is not None
    assert letter.failure.error_class == "stream_jobs.errors.PermanentError"
    assert letter.failure.message == "no such address"
    # retry-5s held the flaky job on the clock, not in real time.
    assert (t.now - began).total_seconds() >= 5
    assert time.monotonic() - real < 5


async def test_a_tour_job_left_for_over_an_hour_expires(job_tester: StartTester) -> None:
    t = job_tester(mail.app)
    await t.enqueue("email.send", {"to": "a@b.c", "subject": "your login code"})
    t.move_clock(3601)  # the tour's expires_in = "1h", and no worker ran meanwhile
    await t.run_until_idle()
    assert t.outcomes == {"expired": 1}
    assert t.done == {}
