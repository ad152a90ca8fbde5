"""Where a batch or a chain stands: `stream-jobs batch ID`, `GET /batches/{id}`, the
dashboard's open batches and `client.progress`.

Read from the workflow's row, whose counters move in each member's finish transaction:
so what it says is exact as of the read. A batch: members succeeded, failed (dead-lettered,
expired, cancelled) and pending, and which callbacks have been written. A chain: steps
done, the step running now, or the step that was dead-lettered and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stream_jobs.errors import ConfigError, UnknownWorkflow
from stream_jobs.plurals import counted
from stream_jobs.postgres.questions import ask
from stream_jobs.settings import Settings
from stream_jobs.workflows.members import step_job_id
from stream_jobs.workflows.sql import workflow_jobs_table, workflows_table

_COLUMNS = ("workflow_id, kind, total, succeeded, failed, created_at, finished_at, "
            "failed_step, failure, parent_job_id")

# What `ask` says when the tables are missing or Postgres fails.
_ABOUT = {"missing": "There are no workflow tables", "about": "batches"}


@dataclass(frozen=True)
class Progress:
    """One batch or chain as its row says."""

    workflow_id: str
    kind: str  # "batch" | "chain"
    total: int
    succeeded: int
    failed: int
    created_at: datetime
    finished_at: datetime | None
    failed_step: int | None = None
    failure: str | None = None
    parent_job_id: str | None = None
    callbacks: tuple[tuple[str, str], ...] = ()  # (slot, job ID) of a batch's callbacks

    @property
    def pending(self) -> int:
        if self.kind == "chain":
            return 0 if self.failed else self.total - self.succeeded
        return self.total - self.succeeded - self.failed

    @property
    def state(self) -> str:
        """"running", "succeeded", "completed" (a batch done with failures), "failed" (a
        chain stopped at a step)."""
        if self.kind == "chain":
            if self.failed:
                return "failed"
            return "succeeded" if self.succeeded >= self.total else "running"
        if self.pending > 0:
            return "running"
        return "succeeded" if self.failed == 0 else "completed"

    def fired(self, slot: str) -> bool:
        """Whether the batch's callback `slot` has been written (it runs once)."""
        if slot == "on_success":
            return self.succeeded == self.total
        return self.succeeded + self.failed == self.total

    def summary(self) -> str:
        """One sentence for a person."""
        if self.kind == "chain":
            if self.failed and self.failed_step is not None:
                return (f"Chain {self.workflow_id} stopped at step {self.failed_step} of "
                        f"{self.total} ({step_job_id(self.workflow_id, self.failed_step)}), "
                        f"dead-lettered: {self.failure or 'no reason given'}.")
            if self.succeeded >= self.total:
                return f"Chain {self.workflow_id} is done: all {self.total} steps succeeded."
            return (f"Chain {self.workflow_id} runs step {self.succeeded} of {self.total} "
                    f"({step_job_id(self.workflow_id, self.succeeded)}); "
                    f"{self.succeeded} done.")
        fired = [slot for slot, _ in self.callbacks if self.fired(slot)]
        calls = f"; callbacks written: {', '.join(fired)}" if fired else ""
        return (f"Batch {self.workflow_id} is {self.state}: {self.succeeded:,} of "
                f"{counted(self.total, 'member')} succeeded, {self.failed:,} failed, "
                f"{self.pending:,} pending{calls}.")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.workflow_id, "kind": self.kind, "state": self.state,
            "summary": self.summary(), "total": self.total, "succeeded": self.succeeded,
            "failed": self.failed, "pending": self.pending,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "failed_step": self.failed_step, "failure": self.failure,
            "parent_job_id": self.parent_job_id,
            "callbacks": [{"slot": slot, "job_id": job_id, "written": self.fired(slot)}
                          for slot, job_id in self.callbacks],
        }


def _progress(row: Any, callbacks: tuple[tuple[str, str], ...] = ()) -> Progress:
    return Progress(row["workflow_id"], row["kind"], row["total"], row["succeeded"],
                    row["failed"], row["created_at"], row["finished_at"], row["failed_step"],
                    row["failure"], row["parent_job_id"], callbacks)


async def _with_callbacks(conn: Any, schema: str, rows: list[Any]) -> list[Progress]:
    """`rows` of the workflows table as Progress, each with its batch's callbacks."""
    calls = await conn.fetch(f"SELECT workflow_id, slot, job_id FROM "
                             f"{workflow_jobs_table(schema)} WHERE workflow_id = "
                             "ANY($1::text[]) AND slot IN ('on_success', 'on_complete') "
                             "ORDER BY slot DESC", [r["workflow_id"] for r in rows])
    by_id: dict[str, list[tuple[str, str]]] = {}
    for c in calls:
        by_id.setdefault(c["workflow_id"], []).append((c["slot"], c["job_id"]))
    return [_progress(r, tuple(by_id.get(r["workflow_id"], ()))) for r in rows]


async def read_progress(settings: Settings, workflow_id: str) -> Progress:
    """The batch or chain `workflow_id`; `UnknownWorkflow` if there is none."""
    schema = settings.database_schema
    if "\x00" in workflow_id or _unencodable(workflow_id):
        # No row can hold it (Postgres' text has no NUL): asked, Postgres would fail, and
        # the answer would be "Postgres failed" (a 503), not "no such batch".
        raise UnknownWorkflow("No batch or chain has the ID given: it holds a NUL or is not "
                              "UTF-8 text, which no row can hold.")

    async def query(conn: Any) -> Progress | None:
        row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM {workflows_table(schema)} "
                                  "WHERE workflow_id = $1", workflow_id)
        if row is None:
            return None
        calls = await conn.fetch(f"SELECT slot, job_id FROM {workflow_jobs_table(schema)} "
                                 "WHERE workflow_id = $1 AND slot IN ('on_success', "
                                 "'on_complete') ORDER BY slot DESC", workflow_id)
        return _progress(row, tuple((c["slot"], c["job_id"]) for c in calls))

    found: Progress | None = await ask(settings, query, **_ABOUT)
    if found is None:
        raise UnknownWorkflow(f"No batch or chain has the ID {workflow_id!r} in schema "
                              f"{schema!r} (or it was pruned).")
    return found


def _unencodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: from bytes that are not UTF-8
        return True
    return False


async def open_workflows(settings: Settings, limit: int = 20) -> tuple[int, list[Progress]]:
    """How many batches and chains are not finished, and the oldest `limit` of them."""
    schema = settings.database_schema

    async def query(conn: Any) -> tuple[int, list[Progress]]:
        table = workflows_table(schema)
        count = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE finished_at IS NULL")
        rows = await conn.fetch(f"SELECT {_COLUMNS} FROM {table} WHERE finished_at IS NULL "
                                "ORDER BY created_at LIMIT $1", limit)
        return int(count), await _with_callbacks(conn, schema, rows)

    result: tuple[int, list[Progress]] = await ask(settings, query, **_ABOUT)
    return result


async def finished_workflows(settings: Settings, limit: int = 20) -> list[Progress]:
    """The `limit` batches and chains finished last, newest first, with their callbacks."""
    schema = settings.database_schema

    async def query(conn: Any) -> list[Progress]:
        rows = await conn.fetch(f"SELECT {_COLUMNS} FROM {workflows_table(schema)} WHERE "
                                "finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT $1",
                                limit)
        return await _with_callbacks(conn, schema, rows)

    result: list[Progress] = await ask(settings, query, **_ABOUT)
    return result


async def prune_finished(settings: Settings, older_than_s: float, *, batch: int = 10_000,
                         dry_run: bool = False) -> int:
    """Delete the batches and chains finished more than `older_than_s` ago, with their
    templates, `batch` per transaction; how many (with `dry_run`: how many would be)."""
    schema = settings.database_schema
    table = workflows_table(schema)
    age = "finished_at < now() - make_interval(secs => $1)"

    async def query(conn: Any) -> int:
        if dry_run:
            return int(await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {age}",
                                           float(older_than_s)))
        deleted = 0
        while True:
            n = int(await conn.fetchval(
                f"WITH gone AS (DELETE FROM {table} WHERE workflow_id IN (SELECT workflow_id "
                f"FROM {table} WHERE {age} ORDER BY finished_at LIMIT $2) "
                "RETURNING workflow_id), templates AS (DELETE FROM "
                f"{workflow_jobs_table(schema)} WHERE workflow_id IN (SELECT workflow_id "
                "FROM gone)) SELECT count(*) FROM gone", float(older_than_s), batch))
            deleted += n
            if n < batch:
                return deleted

    try:
        pruned: int = await ask(settings, query, **_ABOUT)
    except ConfigError:
        return 0  # migrated before workflows existed: there are none to prune
    return pruned



__all__ = ["Progress", "finished_workflows", "open_workflows", "prune_finished", "read_progress"]
