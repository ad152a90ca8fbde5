"""The database schema stream-jobs owns, held by SQLAlchemy and rendered to DDL for
`stream-jobs db migrate`: the dedup table, the transactional outbox's table, the
fencing token sequence, the kept results, the batches' and chains' rows, and the tables of
cancels, unique keys and debounce windows, attempts released early (retry-now), the
tenants' slots and token buckets (per-tenant limits), and the history's windows.

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
    Float,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Sequence,
    String,
    Table,
    Text,
    false,
    func,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateSequence, CreateTable

from stream_jobs.job_ids import MAX_JOB_ID_CHARS
from stream_jobs.postgres.names import FENCING_SEQUENCE
from stream_jobs.tenants import MAX_TENANT_BYTES

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

# Records written in callers' transactions, waiting for a relay (stream_jobs/outbox/).
# `id` orders them: an identity without a per-session cache, so a row written after
# another's commit always has the larger id. A relay deletes a row once Kafka acked it.
outbox_table = Table(
    "stream_jobs_outbox",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("topic", String(249), nullable=False),
    Column("key", LargeBinary, nullable=True),
    Column("value", LargeBinary, nullable=False),
    # [[name, value], ...] in the record's order: every header of ours is text.
    Column("headers", postgresql.JSONB, nullable=False),
    # When the row was written (not when its transaction began): what the age is from.
    Column("created_at", DateTime(timezone=True), nullable=False,
           server_default=func.clock_timestamp()),
    # Set by a relay whose write of the row failed: it waits until retry_at.
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("retry_at", DateTime(timezone=True), nullable=True),
    Column("last_error", Text, nullable=True),
)

# `ctx.fencing_token` (stream_jobs.dedup.fencing): one number for the whole database, no
# row per job, so `db prune` has nothing to remove. CACHE 1 (Postgres' default, spelt out):
# a session caching values would hand out numbers below ones other sessions already gave.
fencing_sequence = Sequence(FENCING_SEQUENCE, metadata=metadata, start=1, cache=1,
                            data_type=BigInteger)

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


# How each job that needs one ended (stream_jobs/results/rules.py): kept results of types with
# `keep_result`, and the state of every batch member and chain step, which is what makes
# their batch's counters exact (a member counts once; a dead letter requeued that then
# succeeds moves from failed to succeeded). Written in the job's dedup transaction; `db
# prune` deletes rows past `expires_at`.
results_table = Table(
    "stream_jobs_results",
    metadata,
    Column("job_id", String(MAX_JOB_ID_CHARS), primary_key=True),
    Column("job_type", String(249), nullable=False),
    Column("state", String(16), nullable=False),
    Column("result", postgresql.JSONB, nullable=True),
    Column("error", Text, nullable=True),
    Column("attempt", Integer, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)
_results_expiry_index = Index("stream_jobs_results_expires_at", results_table.c.expires_at)

# Batches and chains (stream_jobs/workflows/): one row each, its counters moved in the
# same transaction as each member's dedup row (or terminal result row).
workflows_table = Table(
    "stream_jobs_workflows",
    metadata,
    Column("workflow_id", String(MAX_JOB_ID_CHARS), primary_key=True),
    Column("kind", String(8), nullable=False),  # "batch" | "chain"
    Column("total", Integer, nullable=False),
    Column("succeeded", Integer, nullable=False, server_default=text("0")),
    Column("failed", Integer, nullable=False, server_default=text("0")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Batch: its last member finished. Chain: its last step succeeded, or a step failed.
    Column("finished_at", DateTime(timezone=True), nullable=True),
    # Chain: the step that was dead-lettered (0-based) and why; NULL while it runs.
    Column("failed_step", Integer, nullable=True),
    Column("failure", Text, nullable=True),
    # The job whose handler started it (ctx.batch / ctx.chain), if any.
    Column("parent_job_id", String(MAX_JOB_ID_CHARS), nullable=True),
)
# The dashboard lists open ones; `db prune` scans finished ones by time.
_open_workflows_index = Index("stream_jobs_workflows_open", workflows_table.c.created_at,
                              postgresql_where=text("finished_at IS NULL"))
_finished_workflows_index = Index("stream_jobs_workflows_finished_at",
                                  workflows_table.c.finished_at)

# The jobs a batch or chain writes when their turn comes: a batch's callbacks (slot
# "on_success", "on_complete") and a chain's steps after the first (slot "1", "2", ...).
# Each is a whole record, ready for the outbox, but for its times (stamped when written).
workflow_jobs_table = Table(
    "stream_jobs_workflow_jobs",
    metadata,
    Column("workflow_id", String(MAX_JOB_ID_CHARS), primary_key=True),
    Column("slot", String(16), primary_key=True),
    Column("job_id", String(MAX_JOB_ID_CHARS), nullable=False),
    Column("job_type", String(249), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("key", LargeBinary, nullable=True),
    Column("value", LargeBinary, nullable=False),
    Column("headers", postgresql.JSONB, nullable=False),
    Column("expires_in_ms", BigInteger, nullable=True),
)


# Cancel, unique jobs and debounce (stream_jobs/cancels/rules.py, stream_jobs/unique/rules.py).
# A cancel's row; the same transaction writes the job's dedup row (attempt 0), the
# arbiter. Workers load their type's IDs (job_type "" when the canceller named none).
cancels_table = Table(
    "stream_jobs_cancels",
    metadata,
    Column("job_id", String(MAX_JOB_ID_CHARS), primary_key=True),
    Column("job_type", String(249), nullable=False, server_default=""),
    Column("reason", Text, nullable=True),
    Column("cancelled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
_cancels_type_index = Index("stream_jobs_cancels_job_type", cancels_table.c.job_type)
_cancels_at_index = Index("stream_jobs_cancels_cancelled_at", cancels_table.c.cancelled_at)

# A unique key and the job holding it. Held while finished_at is NULL (the job pending)
# and until held_until (unique_for after the enqueue); then the next enqueue takes it.
# taken_in: the transaction that took it, so an enqueue can tell it took the key itself.
unique_table = Table(
    "stream_jobs_unique",
    metadata,
    Column("job_type", String(249), primary_key=True),
    Column("unique_key", String(255), primary_key=True),
    Column("job_id", String(MAX_JOB_ID_CHARS), nullable=False),
    Column("taken_in", BigInteger, nullable=False),
    Column("taken_at", DateTime(timezone=True), nullable=False,
           server_default=func.clock_timestamp()),
    Column("held_until", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
)
_unique_job_index = Index("stream_jobs_unique_job_id", unique_table.c.job_id)

# The open debounce window of a key and its latest job; one row per key, replaced when a
# job comes after the window ended. superseded_job_id: the job the latest one replaced
# (set by the enqueue that replaced it, which marks it in stream_jobs_superseded).
debounce_table = Table(
    "stream_jobs_debounce",
    metadata,
    Column("job_type", String(249), primary_key=True),
    Column("debounce_key", String(255), primary_key=True),
    Column("job_id", String(MAX_JOB_ID_CHARS), nullable=False),
    Column("superseded_job_id", String(MAX_JOB_ID_CHARS), nullable=True),
    Column("window_ends_at", DateTime(timezone=True), nullable=False),
)

# Debounced jobs a newer job of their window replaced: written in that job's enqueue
# transaction, read by the worker before a debounced job starts.
superseded_table = Table(
    "stream_jobs_superseded",
    metadata,
    Column("job_id", String(MAX_JOB_ID_CHARS), primary_key=True),
    Column("job_type", String(249), nullable=False),
    Column("by_job_id", String(MAX_JOB_ID_CHARS), nullable=False),
    Column("superseded_at", DateTime(timezone=True), nullable=False,
           server_default=func.now()),
)
_superseded_at_index = Index("stream_jobs_superseded_at", superseded_table.c.superseded_at)

# Attempts `stream-jobs retry-now` released from their delay tier ahead of their due time
# (stream_jobs/retry_now/): the relay finishes the tier record of one without releasing
# it, and a worker skips a lane record of one that lacks the early mark. Keyed by the
# round (requeues) too: a requeued dead letter counts its attempts from 1 again.
released_early_table = Table(
    "stream_jobs_released_early",
    metadata,
    Column("job_id", String(MAX_JOB_ID_CHARS), primary_key=True),
    Column("requeues", Integer, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("job_type", String(249), nullable=False),
    Column("released_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
_released_type_index = Index("stream_jobs_released_early_job_type",
                             released_early_table.c.job_type)
_released_at_index = Index("stream_jobs_released_early_released_at",
                           released_early_table.c.released_at)


# Per-tenant limits across the fleet (stream_jobs/fairness/): a tenant's running jobs of a
# type each hold one of its slots 0..limit-1, a lease (holder, expires_at) its worker
# renews; a free slot has no holder, a lapsed one an expires_at in the past.
tenant_slots_table = Table(
    "stream_jobs_tenant_slots",
    metadata,
    Column("job_type", String(249), primary_key=True),
    Column("tenant", String(MAX_TENANT_BYTES), primary_key=True),
    Column("slot", Integer, primary_key=True),
    Column("holder", Text, nullable=True),
    Column("expires_at", DateTime(timezone=True), nullable=True),
)
# A holder renews, and at its stop frees, all its slots in one statement.
_tenant_slots_holder_index = Index("stream_jobs_tenant_slots_holder",
                                   tenant_slots_table.c.holder)

# A tenant's token bucket per type (tokens as of refilled_at, on Postgres' clock), and the
# rate `stream-jobs throttle T --tenant X RATE` set: when overridden, override_per_s is the
# rate in force (NULL: no limit), else the TOML's.
tenant_rates_table = Table(
    "stream_jobs_tenant_rates",
    metadata,
    Column("job_type", String(249), primary_key=True),
    Column("tenant", String(MAX_TENANT_BYTES), primary_key=True),
    Column("tokens", Float(precision=53), nullable=False, server_default=text("1")),
    Column("refilled_at", DateTime(timezone=True), nullable=False,
           server_default=func.clock_timestamp()),
    Column("overridden", Boolean, nullable=False, server_default=false()),
    Column("override_per_s", Float(precision=53), nullable=True),
    Column("override_at", DateTime(timezone=True), nullable=True),
)

# History (stream_jobs/history/): each window's tally per type, as the history process's
# exactly-once tables hold it (set, never added to, so a row written twice is right). size_s
# is the window's length (60 or 3600 outside tests); size_s 0, start_ms 0 is the type's
# running total since history began.
history_table = Table(
    "stream_jobs_history",
    metadata,
    Column("job_type", String(249), primary_key=True),
    Column("size_s", Integer, primary_key=True),
    Column("start_ms", BigInteger, primary_key=True),
    Column("tally", postgresql.JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# What `schema_ddl` creates (besides indexes), by name, in the order `db migrate` lists
# them: every table of `metadata`, then the sequence.
SCHEMA_OBJECTS: tuple[str, ...] = (*metadata.tables, FENCING_SEQUENCE)


def control_ddl() -> list[str]:
    """The statements for the cancel, unique-key, debounce and released-early tables."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    out = []
    for table in (cancels_table, unique_table, debounce_table, superseded_table,
                  released_early_table):
        out.append(str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)))
    for index in (_cancels_type_index, _cancels_at_index, _unique_job_index,
                  _superseded_at_index, _released_type_index, _released_at_index):
        out.append(str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)))
    return out


def tenant_limits_ddl() -> list[str]:
    """The statements for the per-tenant limits' slots and buckets."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return [*(str(CreateTable(t, if_not_exists=True).compile(dialect=dialect))
              for t in (tenant_slots_table, tenant_rates_table)),
            str(CreateIndex(_tenant_slots_holder_index, if_not_exists=True)
                .compile(dialect=dialect))]


def schema_ddl() -> list[str]:
    """The statements that create the schema, rendered by SQLAlchemy for Postgres."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return [
        str(CreateTable(done_table, if_not_exists=True).compile(dialect=dialect)),
        str(CreateIndex(_finished_index, if_not_exists=True).compile(dialect=dialect)),
        str(CreateTable(outbox_table, if_not_exists=True).compile(dialect=dialect)),
        str(CreateTable(schedules_table, if_not_exists=True).compile(dialect=dialect)),
        str(CreateSequence(fencing_sequence, if_not_exists=True).compile(dialect=dialect)),
        *(str(CreateTable(t, if_not_exists=True).compile(dialect=dialect))
          for t in (results_table, workflows_table, workflow_jobs_table)),
        *(str(CreateIndex(i, if_not_exists=True).compile(dialect=dialect))
          for i in (_results_expiry_index, _open_workflows_index, _finished_workflows_index)),
        *control_ddl(),
        *tenant_limits_ddl(),
        str(CreateTable(history_table, if_not_exists=True).compile(dialect=dialect)),
    ]
