"""The dedup schema and the fencing token sequence, owned by SQLAlchemy and rendered to
DDL for `stream-jobs db migrate`.

Kept apart from `dedup.py` so that importing the runtime does not import SQLAlchemy.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Sequence,
    String,
    Table,
    func,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateSequence, CreateTable

from stream_jobs.dedup.fencing import FENCING_SEQUENCE
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

# `ctx.fencing_token` (stream_jobs.dedup.fencing): one number for the whole database, no
# row per job, so `db prune` has nothing to remove. CACHE 1 (Postgres' default, spelt out):
# a session caching values would hand out numbers below ones other sessions already gave.
fencing_sequence = Sequence(FENCING_SEQUENCE, metadata=metadata, start=1, cache=1,
                            data_type=BigInteger)


def schema_ddl() -> list[str]:
    """The statements that create the dedup schema, rendered by SQLAlchemy for Postgres."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    table = str(CreateTable(done_table, if_not_exists=True).compile(dialect=dialect))
    index = str(CreateIndex(_finished_index, if_not_exists=True).compile(dialect=dialect))
    tokens = str(CreateSequence(fencing_sequence, if_not_exists=True).compile(dialect=dialect))
    return [table, index, tokens]
