"""The README's five-minute tour on the real stack: `consumers/mail.py` and its three jobs.

The README shows that file as it is (tests/unit/test_readme.py checks it), so this is the
tour's handler, not a copy: one job succeeds, one fails its first attempt and succeeds
from the delay tier, one is dead-lettered by `PermanentError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from consumers import mail
from stream_jobs.app import App
from stream_jobs.dlq.listing import show_letter
from stream_jobs.lookup import locate_job
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings

from .conftest import Declare


@pytest.fixture
async def tour(settings: Settings, schema: str) -> AsyncIterator[App]:
    """The tour's app on this test's topics and schema: `sent_emails` and the dedup table
    made, as step 4 of the tour makes them."""
    await prepare_schema(settings, [mail.SCHEMA])
    before = mail.app.settings
    mail.app.use_settings(settings)
    try:
        yield mail.app
    finally:
        mail.app.use_settings(before)


async def test_the_tour_succeeds_retries_once_and_dead_letters(
        tour: App, declare: Declare, settings: Settings) -> None:
    # The tour's topics/email.send.toml, with a short first tier so the retry is quick.
    await declare("email.send", partitions=2, retry_tiers=["1s"], max_attempts=4,
                  priorities=["high", "default", "low"], expires_in="1h")
    async with tour.client() as client:
        sent = await client.enqueue("email.send", {"to": "a@b.c", "subject": "hi"})
        flaky = await client.enqueue("email.send", {"to": "x@y.z", "subject": "flaky"})
        nobody = await client.enqueue("email.send", {"to": "nobody", "subject": "hi"})

    worker = tour.worker("email.send")
    await worker.run(until_idle=True)  # lanes and the delay tier read to their ends
    assert dict(worker.outcomes) == {"succeeded": 2, "retried": 1, "dead_lettered": 1}

    types = tour.job_types()
    first = await locate_job(settings, types, sent, job_type="email.send")
    assert (first.status, first.attempt) == ("done", 1)
    second = await locate_job(settings, types, flaky, job_type="email.send")
    assert (second.status, second.attempt) == ("done", 2)
    dead = await locate_job(settings, types, nobody, job_type="email.send")
    assert dead.status == "dead_lettered"
    assert dead.last is not None
    assert dead.last.failure is not None
    assert dead.last.failure.reason == "permanent"
    assert dead.last.failure.error_class == "stream_jobs.errors.PermanentError"
    assert dead.last.failure.message == "no such address"
    assert dead.summary().endswith(
        "permanent, stream_jobs.errors.PermanentError: no such address.")

    letter = await show_letter(settings, "email.send", nobody)
    assert (letter.reason, letter.attempt) == ("permanent", 1)
    assert letter.topic == f"{settings.topic_prefix}.email.send.dlq"

    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        rows = await conn.fetch("SELECT job_id, recipient FROM sent_emails")
    finally:
        await conn.close()
    assert {row["job_id"]: row["recipient"] for row in rows} == {sent: "a@b.c", flaky: "x@y.z"}
