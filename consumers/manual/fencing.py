# consumers/manual/fencing.py
"""docs/fencing.md: a write to a store outside the dedup database, fenced by its token."""

import os

import asyncpg
from pydantic import BaseModel

from stream_jobs import App, JobContext

app = App()

# The store: a database other than the dedup one (DOCUMENTS_URL, such as
# postgresql://app@store.internal/documents). Unset, the dedup database's schema
# STREAM_JOBS_DATABASE_SCHEMA stands in for it, to try the page out.
STORE_URL = os.environ.get("DOCUMENTS_URL") or (
    f"{app.settings.database_url}?search_path={app.settings.database_schema}")

DOCUMENTS = """
    CREATE TABLE documents (doc_id text PRIMARY KEY, body text NOT NULL, token bigint NOT NULL)
"""
FENCED_WRITE = """
    INSERT INTO documents AS d (doc_id, body, token) VALUES ($1, $2, $3)
    ON CONFLICT (doc_id) DO UPDATE SET body = EXCLUDED.body, token = EXCLUDED.token
    WHERE d.token <= EXCLUDED.token
"""


class Publish(BaseModel):
    doc_id: str
    body: str


_store: asyncpg.Pool | None = None


async def store() -> asyncpg.Pool:
    global _store
    if _store is None:
        _store = await asyncpg.create_pool(STORE_URL)
    return _store


@app.job("doc.publish", timeout=60)
async def publish(job: Publish, ctx: JobContext) -> None:
    token = await ctx.fencing_token             # first, before reading what the write uses
    body = job.body.strip()                     # ... the slow work ...
    status = await (await store()).execute(FENCED_WRITE, job.doc_id, body, token)
    if status == "INSERT 0 0":
        # A later run of this job has written the row: this run's work is superseded.
        # Not an error: raising would only retry the job.
        return
