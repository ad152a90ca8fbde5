"""The names the runtime uses for its objects in the database: the fencing sequence
(apart from the SQLAlchemy tables of `stream_jobs.postgres.schema`, since importing the
runtime must not import SQLAlchemy), and its own statements.

A statement of the runtime's own (a result row, a batch's counters, a workflow's rows,
outbox rows) is made through `named()`, which keeps its name by its text. Postgres runs
the text; the in-memory tables of `stream_jobs.testing` apply it by its name and refuse
a name they do not know, so a statement added here without its in-memory twin fails a
test instead of passing as a handler's effect.
"""

from __future__ import annotations

# `ctx.fencing_token` (stream_jobs.dedup.fencing): one sequence for the whole database.
FENCING_SEQUENCE = "stream_jobs_fencing_tokens"

# The runtime's own statements (stream_jobs.workflows.sql, stream_jobs.outbox.rows).
RESULT_SUCCEEDED = "result.succeeded"
RESULT_ENDED = "result.ended"
MEMBER_SUCCEEDED = "batch.member-succeeded"
MEMBER_ENDED = "batch.member-ended"
WORKFLOW_INSERT = "workflow.insert"
WORKFLOW_STEPS = "workflow.steps"
OUTBOX_INSERT = "outbox.insert"


# Text -> name of every runtime statement made so far (a few per schema).
_NAMES: dict[str, str] = {}


def named(sql: str, name: str) -> str:
    """`sql`, known from now on as the runtime's statement `name`. The text stays a plain
    `str` (the driver takes nothing else), so the name is kept beside it, by its text."""
    _NAMES[sql] = name
    return sql


def statement_name(sql: str) -> str | None:
    """The runtime's name of `sql`, or None for a statement of a handler's."""
    return _NAMES.get(sql)
