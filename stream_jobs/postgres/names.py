"""The names of the schema's objects that the runtime uses by name, apart from the
SQLAlchemy tables of `stream_jobs.postgres.schema` (importing the runtime must not import
SQLAlchemy).
"""

from __future__ import annotations

# `ctx.fencing_token` (stream_jobs.dedup.fencing): one sequence for the whole database.
FENCING_SEQUENCE = "stream_jobs_fencing_tokens"
