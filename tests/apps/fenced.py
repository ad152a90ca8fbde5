"""The fenced app: `stream-jobs worker tests.apps.fenced:app --type doc.publish`.

A handler whose effect lives outside `ctx.once()`: the `documents` table stands in for an
object store or a search index, and takes a write only with a fencing token not below the
one it holds. tests/integration/test_fencing.py creates the tables in the test's schema
(`STREAM_JOBS_DATABASE_SCHEMA`):

- `documents(doc_id PK, body, token)`: the fenced store;
- `unfenced(doc_id PK, body)`: the same writes without the check (last writer wins), so a
  test sees which write came last;
- `writes(id, doc_id, pid, token, step, accepted)`: every write, in the order made;
- `gate(open)`: a job's first run holds between its two writes (`draft`, `final`) until
  the test opens the gate (and NOTIFYs `gate`), so the test can stop the process in
  between.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg
from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.context import JobContext
from tests.apps.bookkeeping import BookkeepingPool

app = App()

JOB_TYPE = "doc.publish"

TABLES = [
    "CREATE TABLE documents (doc_id text PRIMARY KEY, body text NOT NULL, "
    "token bigint NOT NULL)",
    "CREATE TABLE unfenced (doc_id text PRIMARY KEY, body text NOT NULL)",
    "CREATE TABLE writes (id bigserial PRIMARY KEY, doc_id text NOT NULL, pid int NOT NULL, "
    "token bigint NOT NULL, step text NOT NULL, accepted boolean NOT NULL)",
    "CREATE TABLE gate (open boolean NOT NULL)",
    "INSERT INTO gate VALUES (false)",
]

# The pattern of docs/fencing.md: the row changes only for a token not below the stored
# one. Equal is the same run (no two deliveries get one token), which writes twice here.
FENCED_WRITE = (
    "INSERT INTO documents AS d (doc_id, body, token) VALUES ($1, $2, $3) "
    "ON CONFLICT (doc_id) DO UPDATE SET body = EXCLUDED.body, token = EXCLUDED.token "
    "WHERE d.token <= EXCLUDED.token")
UNFENCED_WRITE = (
    "INSERT INTO unfenced (doc_id, body) VALUES ($1, $2) "
    "ON CONFLICT (doc_id) DO UPDATE SET body = EXCLUDED.body")


class Doc(BaseModel):
    doc_id: str
    body: str


_pool = BookkeepingPool(app)


async def _write(pool: Any, doc_id: str, body: str, token: int, step: str) -> bool:
    status = await pool.execute(FENCED_WRITE, doc_id, body, token)
    accepted = bool(status == "INSERT 0 1")
    await pool.execute(UNFENCED_WRITE, doc_id, body)
    await pool.execute("INSERT INTO writes (doc_id, pid, token, step, accepted) "
                       "VALUES ($1, $2, $3, $4, $5)", doc_id, os.getpid(), token, step, accepted)
    return accepted


async def _gate_opens() -> None:
    """Return once the gate is open (the test sets the row and then NOTIFYs `gate`)."""
    settings = app.settings
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        opened = asyncio.Event()
        await conn.add_listener("gate", lambda *_: opened.set())
        if not await conn.fetchval("SELECT open FROM gate"):
            await opened.wait()
    finally:
        await conn.close()


@app.job(JOB_TYPE, timeout=120, concurrency=4)
async def publish(job: Doc, ctx: JobContext) -> None:
    token = await ctx.fencing_token  # first, before anything the writes depend on
    pool = await _pool.get()
    body = f"{job.body} by pid {os.getpid()} with token {token}"
    await _write(pool, job.doc_id, f"draft of {body}", token, "draft")
    runs = await pool.fetchval("SELECT count(DISTINCT pid) FROM writes WHERE doc_id = $1",
                               job.doc_id)
    if runs == 1:  # the first run: slow work, long enough to be stopped in the middle
        await _gate_opens()
    await _write(pool, job.doc_id, body, token, "final")
