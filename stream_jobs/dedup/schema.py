"""The dedup schema, owned by SQLAlchemy and rendered to DDL for `stream-jobs db migrate`.

Kept apart from `dedup.py` so that importing the runtime does not import SQLAlchemy.
`db migrate` also creates the schedules' state (`stream_jobs_schedules`, read and written
by `stream_jobs.schedules.state`), so one command readies the database.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
    func,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from stream_jobs.job_ids import MAX_JOB_ID_CHARS

metadata = MetaData()

done_table = Table(
    "stream_jobs_done",
    metadata,
    Column("job_id", String(MAX_JOB_ID_CHARS), primary_key=True),
    Column("job_type", String(249), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
# `db prune --older-than` and per-type questions scan by time.
_finished_index = Index("stream_jobs_done_finished_at", done_table.c.finished_at)

# One row per schedule: what its leader has handled (fire times up to `horizon_ms`, Unix
# ms), what it fired last, and whether an operator paused it. Keyed by the topic prefix
# too, since two deployments may share a schema but never a schedule.
schedules_table = Table(
    "stream_jobs_schedules",
    metadata,
    Column("topic_prefix", String(249), primary_key=True),
    Column("job_type", String(249), primary_key=True),
    Column("name", String(100), primary_key=True),
    Column("spec", Text, nullable=False),  # how it fires, e.g. "cron 0 3 * * * (UTC)"
    Column("paused", Boolean, nullable=False, server_default=false()),
    Column("horizon_ms", BigInteger, nullable=False),
    Column("next_fire_ms", BigInteger),
    Column("last_fired_ms", BigInteger),
    Column("last_job_id", String(MAX_JOB_ID_CHARS)),
    Column("last_enqueued_at", DateTime(timezone=True)),
    Column("missed_total", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)


def schema_ddl() -> list[str]:
    """The statements that create the dedup schema, rendered by SQLAlchemy for Postgres."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    table = str(CreateTable(done_table, if_not_exists=True).compile(dialect=dialect))
    index = str(CreateIndex(_finished_index, if_not_exists=True).compile(dialect=dialect))
    schedules = str(CreateTable(schedules_table, if_not_exists=True).compile(dialect=dialect))
    return [table, index, schedules]
