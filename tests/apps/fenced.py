"""The fenced app: `stream-jobs worker tests.apps.fenced:app --type doc.publish` (an `async
def` handler), or `--type doc.publish_sync` (the same handler as a plain `def`, on psycopg).

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
import re
from typing import Any

import asyncpg
import psycopg
from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.context import JobContext
from tests.apps.bookkeeping import BookkeepingPool

app = App()

JOB_TYPE = "doc.publish"
SYNC_JOB_TYPE = "doc.publish_sync"

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
LOGGED_WRITE = ("INSERT INTO writes (doc_id, pid, token, step, accepted) "
                "VALUES ($1, $2, $3, $4, $5)")
RUNS = "SELECT count(DISTINCT pid) FROM writes WHERE doc_id = $1"


class Doc(BaseModel):
    doc_id: str
    body: str


_pool = BookkeepingPool(app)


async def _write(pool: Any, doc_id: str, body: str, token: int, step: str) -> bool:
    status = await pool.execute(FENCED_WRITE, doc_id, body, token)
    accepted = bool(status == "INSERT 0 1")
    await pool.execute(UNFENCED_WRITE, doc_id, body)
    await pool.execute(LOGGED_WRITE, doc_id, os.getpid(), token, step, accepted)
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
    runs = await pool.fetchval(RUNS, job.doc_id)
    if runs == 1:  # the first run: slow work, long enough to be stopped in the middle
        await _gate_opens()
    await _write(pool, job.doc_id, body, token, "final")


# -- the same handler as a plain `def`: the same statements, through psycopg --------------


def _psycopg(sql: str) -> str:
    return re.sub(r"\$\d+", "%s", sql)


def _connect() -> psycopg.Connection[Any]:
    settings = app.settings
    return psycopg.connect(
        settings.database_url, autocommit=True,
        options=f"-c search_path={settings.database_schema} -c synchronous_commit=off")


def _write_sync(conn: psycopg.Connection[Any], doc_id: str, body: str, token: int,
                step: str) -> bool:
    accepted = conn.execute(_psycopg(FENCED_WRITE), (doc_id, body, token)).rowcount == 1
    conn.execute(_psycopg(UNFENCED_WRITE), (doc_id, body))
    conn.execute(_psycopg(LOGGED_WRITE), (doc_id, os.getpid(), token, step, accepted))
    return accepted


def _gate_opens_sync(conn: psycopg.Connection[Any]) -> None:
    """`_gate_opens` on the handler's thread: return once the gate is open."""
    conn.execute("LISTEN gate")
    while not _fetch_one(conn, "SELECT open FROM gate"):
        # Woken by the NOTIFY. One that came in while the SELECT ran is kept for
        # notifies() by psycopg 3.3; looking again each second does not rely on that.
        for _ in conn.notifies(timeout=1.0, stop_after=1):
            pass


def _fetch_one(conn: psycopg.Connection[Any], sql: str, *args: Any) -> Any:
    row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]


@app.job(SYNC_JOB_TYPE, timeout=120, concurrency=4)
def publish_sync(job: Doc, ctx: JobContext) -> None:
    token = ctx.fencing_token_sync()  # first, before anything the writes depend on
    with _connect() as conn:
        body = f"{job.body} by pid {os.getpid()} with token {token}"
        _write_sync(conn, job.doc_id, f"draft of {body}", token, "draft")
        if _fetch_one(conn, _psycopg(RUNS), job.doc_id) == 1:  # the first run: stop here
            _gate_opens_sync(conn)
        _write_sync(conn, job.doc_id, body, token, "final")
