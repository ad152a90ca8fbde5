"""Workflows whose jobs cross types, for tests/integration/test_until_idle.py:
`stream-jobs worker tests.apps.flows:app --until-idle` must not exit while one of them
still has a job to run.

- a batch of `album.photo` members whose `on_complete` callback is an `album.report`;
- a chain `video.fetch` -> `video.transcode` -> `video.publish`, each step returning
  what the next one adds to.

Each job inserts a row into `runs(job_type, job_id, parent)` in its exactly-once block
(the test creates the table in its schema, `STREAM_JOBS_DATABASE_SCHEMA`). The first
member and the middle step fail their first attempt and wait a few seconds in a delay
tier, so the callback and the last step are written well after their types' lanes were
first found empty, as real work that takes a while (or is retried) makes them.
"""

from __future__ import annotations

from typing import Any

from stream_jobs.app import App
from stream_jobs.context import JobContext

app = App()
MEMBER, CALLBACK = "album.photo", "album.report"
STEPS = ("video.fetch", "video.transcode", "video.publish")
TYPES = (MEMBER, CALLBACK, *STEPS)
RUNS_DDL = "CREATE TABLE runs (job_type text NOT NULL, job_id text NOT NULL, parent text)"


async def _record(ctx: JobContext, parent: Any = None) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO runs (job_type, job_id, parent) VALUES ($1, $2, $3)",
                           ctx.job_type, ctx.job_id, None if parent is None else str(parent))


@app.job(MEMBER, concurrency=4)
async def photo(job: dict[str, Any], ctx: JobContext) -> None:
    if job["n"] == 0 and ctx.attempt == 1:
        raise RuntimeError("fails once: the retry waits in the delay tier")
    await _record(ctx)


@app.job(CALLBACK)
async def report(job: dict[str, Any], ctx: JobContext) -> None:
    await _record(ctx, job["batch"]["succeeded"])


async def _step(job: dict[str, int], ctx: JobContext) -> int:
    if ctx.job_type == STEPS[1] and ctx.attempt == 1:
        raise RuntimeError("fails once: the retry waits in the delay tier")
    await _record(ctx, ctx.parent_result)
    return int(ctx.parent_result or 0) + job["add"]


for _type in STEPS:
    app.job(_type)(_step)
