"""The demo app: three realistic job types, and the scenario `stream-jobs demo` runs.

Handlers write their effects through `ctx.once()`, into tables without unique
constraints, so the end of the demo can count that every effect happened exactly once.
Payloads carry `fail_times` / `always_fail` so the demo can show retries and dead letters.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from pydantic import BaseModel

from stream_jobs import App, JobContext, PermanentError
from stream_jobs.postgres.migrate import prepare_schema

app = App()


class SendEmail(BaseModel):
    to: str
    subject: str
    fail_times: int = 0  # fail this many attempts, then succeed (a flaky SMTP relay)
    always_fail: bool = False


class ResizeImage(BaseModel):
    image_id: str
    width: int
    fail_times: int = 0
    corrupt: bool = False  # a corrupt upload: retrying cannot help


class IndexDocument(BaseModel):
    doc_id: str
    version: int
    fail_times: int = 0


EFFECT_TABLES = {
    "email.send": "demo_outbox",
    "image.resize": "demo_thumbnails",
    "search.index": "demo_search_docs",
}
SCHEMA = [f"CREATE TABLE IF NOT EXISTS {table} (job_id text NOT NULL, detail text NOT NULL)"
          for table in EFFECT_TABLES.values()]


def _flaky(ctx: JobContext, fail_times: int) -> None:
    if ctx.attempt <= fail_times:
        raise ConnectionError(f"upstream timed out (attempt {ctx.attempt})")


@app.job("email.send", timeout=10, concurrency=32)
async def send_email(job: SendEmail, ctx: JobContext) -> None:
    _flaky(ctx, job.fail_times)
    if job.always_fail:
        raise ConnectionError("the mail relay refuses this sender")
    await asyncio.sleep(random.uniform(0.001, 0.01))  # the SMTP round trip
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO demo_outbox VALUES ($1, $2)", ctx.job_id, job.to)


@app.job("image.resize", timeout=30, concurrency=8, ordering="unordered")
async def resize_image(job: ResizeImage, ctx: JobContext) -> None:
    if job.corrupt:
        raise PermanentError(f"image {job.image_id} is not a valid PNG")
    _flaky(ctx, job.fail_times)
    await asyncio.sleep(random.uniform(0.005, 0.02))  # the resize itself
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO demo_thumbnails VALUES ($1, $2)", ctx.job_id,
                           f"{job.image_id}@{job.width}")


@app.job("search.index", timeout=10, concurrency=16, ordering="key")
async def index_document(job: IndexDocument, ctx: JobContext) -> None:
    _flaky(ctx, job.fail_times)
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO demo_search_docs VALUES ($1, $2)", ctx.job_id,
                           f"{job.doc_id}v{job.version}")


@dataclass(frozen=True)
class Expected:
    """What the scenario enqueued per type, and how each job should end."""

    enqueued: int
    succeeded: int
    dead_lettered: int
    retried: int


def scenario(rng: random.Random) -> tuple[list[tuple[str, BaseModel, str | None, str]],
                                          dict[str, Expected]]:
    """The mixed load: (type, payload, key, lane) per job, and the expected outcomes.

    Malformed records are added by the runner (they never pass the client's checks).
    """
    jobs: list[tuple[str, BaseModel, str | None, str]] = []
    for i in range(300):
        lane = "high" if i % 10 == 0 else "low" if i % 10 == 9 else "default"
        fail_times = 1 if i % 15 == 1 else 0
        always = i % 60 == 7
        jobs.append(("email.send", SendEmail(to=f"user{i}@example.test", subject="Welcome",
                                              fail_times=fail_times, always_fail=always),
                     f"user-{i}", lane))
    for i in range(150):
        jobs.append(("image.resize", ResizeImage(image_id=f"img-{i}", width=rng.choice(
            [128, 256, 512]), fail_times=1 if i % 15 == 2 else 0, corrupt=i % 50 == 3),
            None, "default"))
    for i in range(300):
        jobs.append(("search.index", IndexDocument(doc_id=f"doc-{i % 60}", version=i // 60,
                                                   fail_times=2 if i % 30 == 4 else 0),
                     f"doc-{i % 60}", "default"))
    emails = [p for t, p, _, _ in jobs if t == "email.send"]
    email_dead = sum(1 for p in emails if isinstance(p, SendEmail) and p.always_fail)
    email_once = sum(1 for p in emails if isinstance(p, SendEmail) and p.fail_times
                     and not p.always_fail)
    images = [p for t, p, _, _ in jobs if t == "image.resize"]
    image_dead = sum(1 for p in images if isinstance(p, ResizeImage) and p.corrupt)
    image_once = sum(1 for p in images if isinstance(p, ResizeImage) and p.fail_times
                     and not p.corrupt)
    docs = [p for t, p, _, _ in jobs if t == "search.index"]
    doc_twice = sum(1 for p in docs if isinstance(p, IndexDocument) and p.fail_times)
    expected = {
        # An always-failing email takes 4 attempts: 3 retries, then the DLQ.
        "email.send": Expected(len(emails), len(emails) - email_dead, email_dead,
                               email_once + 3 * email_dead),
        "image.resize": Expected(len(images), len(images) - image_dead, image_dead,
                                 image_once),
        "search.index": Expected(len(docs), len(docs), 0, 2 * doc_twice),
    }
    return jobs, expected



if __name__ == "__main__":
    # `python -m consumers.demo`: the demo's effect tables and the dedup table, in the
    # database the settings name (docker-compose.yml's setup service runs this).
    asyncio.run(prepare_schema(app.settings, SCHEMA))
