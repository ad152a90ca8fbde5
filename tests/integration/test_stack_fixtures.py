"""The stream_jobs.testing fixtures as a user's handler test meets them, on whichever backend
`STREAM_JOBS_TEST_BACKEND` names (`make test` runs this module on testcontainers too).

The handler test at the end is the one docs/testing.md shows: an app defined at module
level, as a user's is, bound to the test's topics and schema.
"""

from __future__ import annotations

import os

import asyncpg
from pydantic import BaseModel

from stream_jobs import App, JobContext, PermanentError
from stream_jobs.kafka.admin import open_admin
from stream_jobs.settings import Settings
from stream_jobs.testing.plugin import Bind
from stream_jobs.testing.stack import Declare, TestStack, choose_backend

# --- what a user's module holds (docs/testing.md shows this) ---------------------------
app = App()

SCHEMA = "CREATE TABLE welcome_emails (job_id text PRIMARY KEY, address text NOT NULL)"


class Welcome(BaseModel):
    address: str


@app.job("email.welcome")
async def send_welcome(job: Welcome, ctx: JobContext) -> None:
    if "@" not in job.address:
        raise PermanentError("not an address")
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO welcome_emails VALUES ($1, $2)", ctx.job_id,
                           job.address)
# ----------------------------------------------------------------------------------------


def test_the_stack_comes_from_the_backend_asked_for(stream_jobs_stack: TestStack) -> None:
    # make test's testcontainers run must not quietly fall back to another stack.
    assert stream_jobs_stack.backend == choose_backend(os.environ)
    if stream_jobs_stack.backend == "testcontainers":
        assert stream_jobs_stack.kafka_bootstrap != os.environ.get("STREAM_JOBS_KAFKA_BOOTSTRAP")


async def test_declare_makes_the_types_topics_under_the_tests_prefix(
        stream_jobs_declare: Declare, stream_jobs_settings: Settings,
        stream_jobs_prefix: str) -> None:
    policy = await stream_jobs_declare("report.build", partitions=3, retry_tiers=["1s", "5s"],
                                       max_attempts=3)
    assert policy.partitions == 3
    assert (stream_jobs_settings.topics_dir / "report.build.toml").is_file()
    assert stream_jobs_settings.topic_prefix == stream_jobs_prefix
    async with open_admin(stream_jobs_settings) as admin:
        topics = await admin.topic_names()
    ours = {name for name in topics if name.startswith(f"{stream_jobs_prefix}.")}
    base = f"{stream_jobs_prefix}.report.build"
    assert ours == {base, f"{base}.retry-1s", f"{base}.retry-5s", f"{base}.dlq"}


async def test_the_schema_is_the_tests_own_and_empty(stream_jobs_settings: Settings,
                                                     stream_jobs_schema: str) -> None:
    assert stream_jobs_schema == stream_jobs_settings.database_schema
    conn = await asyncpg.connect(stream_jobs_settings.database_url)
    try:
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
            stream_jobs_schema)
        exists = await conn.fetchval(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1",
            stream_jobs_schema)
    finally:
        await conn.close()
    assert exists == 1
    assert tables == []


async def test_a_users_handler_runs_on_the_stack(stream_jobs_declare: Declare,
                                                 stream_jobs_bind: Bind,
                                                 stream_jobs_settings: Settings) -> None:
    before = app.settings
    bound = stream_jobs_bind(app, SCHEMA)
    assert bound.settings == stream_jobs_settings
    await stream_jobs_declare("email.welcome", partitions=2, retry_tiers=["1s"],
                              max_attempts=2)
    async with app.client() as client:
        sent = [await client.enqueue("email.welcome", Welcome(address=f"u{i}@example.com"))
                for i in range(3)]
        refused = await client.enqueue("email.welcome", {"address": "nobody"})

    worker = app.worker("email.welcome")
    await worker.run(until_idle=True)

    assert dict(worker.outcomes) == {"succeeded": 3, "dead_lettered": 1}
    conn = await asyncpg.connect(stream_jobs_settings.database_url, server_settings={
        "search_path": stream_jobs_settings.database_schema})
    try:
        rows = await conn.fetch("SELECT job_id FROM welcome_emails")
    finally:
        await conn.close()
    assert sorted(row["job_id"] for row in rows) == sorted(sent)
    assert refused not in {row["job_id"] for row in rows}
    assert before != stream_jobs_settings  # bind swapped real settings for the test's
