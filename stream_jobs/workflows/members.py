"""Who belongs to a batch or a chain, and the jobs written when their turn comes. Pure.

A member of batch B carries the header `sj-workflow: batch:B`; step i of chain C carries
`sj-workflow: chain:i:C` (steps count from 0). The header travels with the job through
retries, dead letters and requeues, so whichever delivery finishes the job moves its
batch's counters (once: `stream_jobs.workflows.sql`).

Jobs a workflow writes later (a batch's callbacks, a chain's next steps) are prepared
when the workflow is made, checked like any enqueue, and kept as `JobTemplate`s: whole
records but for their times, which are stamped when they are written. Their job IDs are
fixed, derived from the workflow's ID, so however often a completion is attempted the
callback is one job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import orjson
from pydantic import BaseModel

from stream_jobs.errors import ConfigError
from stream_jobs.job_ids import MAX_JOB_ID_CHARS, key_problem
from stream_jobs.outbox.rows import child_job_id, encode_headers
from stream_jobs.record import HEADER_ENQUEUED_AT, HEADER_EXPIRES_AT, JobRecord

Kind = Literal["batch", "chain"]
CALLBACK_SLOTS = ("on_success", "on_complete")
# The key of a callback's payload that gets the batch's summary (`BatchSummary`).
SUMMARY_KEY = "batch"


class BatchSummary(BaseModel):
    """What a batch's callback finds under `"batch"` in its payload: declare a field
    `batch: BatchSummary | None = None` in the callback's model (or read the dict)."""

    id: str
    total: int
    succeeded: int
    failed: int  # dead-lettered, expired or cancelled members


@dataclass(frozen=True, slots=True)
class Membership:
    """The workflow a job belongs to, from its `sj-workflow` header."""

    kind: Kind
    workflow_id: str
    step: int = 0  # a chain's step, from 0; 0 for a batch member

    def header(self) -> str:
        if self.kind == "batch":
            return f"batch:{self.workflow_id}"
        return f"chain:{self.step}:{self.workflow_id}"

    @property
    def previous_step_id(self) -> str | None:
        """The job ID of the chain step before this one (None for a first step or a batch)."""
        if self.kind != "chain" or self.step == 0:
            return None
        return step_job_id(self.workflow_id, self.step - 1)


def parse_membership(text: str | None) -> Membership | None:
    """The membership a header names, or None when there is none or it is garbled (the
    job then runs as a job of its own: nothing is known to count it in)."""
    if not text:
        return None
    kind, _, rest = text.partition(":")
    if kind == "batch" and rest:
        return Membership("batch", rest)
    if kind == "chain":
        step, _, chain_id = rest.partition(":")
        if step.isdigit() and len(step) <= 9 and chain_id:
            return Membership("chain", chain_id, int(step))
    return None


def step_job_id(chain_id: str, step: int) -> str:
    """The job ID of step `step` of chain `chain_id` (the same every time)."""
    return child_job_id(chain_id, f"step:{step}")


def callback_job_id(batch_id: str, slot: str) -> str:
    """The job ID of a batch's `on_success` or `on_complete` callback."""
    return child_job_id(batch_id, slot)


def workflow_id_for(parent_job_id: str, name: str) -> str:
    """The ID of a batch or chain started by a job's handler: the same every time the
    parent runs, so a parent that runs again starts the same one."""
    return child_job_id(parent_job_id, f"workflow:{name}")


def check_workflow_id(workflow_id: str) -> str:
    """`workflow_id` if it fits the workflow's row (1 to 64 characters) and its members'
    `sj-workflow` header, which the decoder refuses with a control character in it."""
    if not workflow_id or len(workflow_id) > MAX_JOB_ID_CHARS:
        raise ConfigError(f"A batch or chain ID must be 1 to {MAX_JOB_ID_CHARS} characters.")
    problem = key_problem(workflow_id, "batch or chain ID")
    if problem is not None:
        raise ConfigError(problem)
    return workflow_id


def with_summary(payload: bytes, batch_id: str, total: int, job_type: str) -> bytes:
    """A callback's payload with a `BatchSummary` of nothing done yet, so its model is
    checked with the field it will get; the real counts replace it when it is written.
    Refuses a payload that sets `"batch"` itself."""
    value = orjson.loads(payload)
    if not isinstance(value, dict):
        raise ConfigError(f"The {job_type} callback's payload must be a JSON object.")
    if value.get(SUMMARY_KEY) is not None:
        raise ConfigError(f"The {job_type} callback's payload sets {SUMMARY_KEY!r}, which is "
                          "where the batch's summary goes: use another name for your field.")
    value[SUMMARY_KEY] = {"id": batch_id, "total": total, "succeeded": 0, "failed": 0}
    return orjson.dumps(value)


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """A job a workflow writes when its turn comes (a row of `stream_jobs_workflow_jobs`)."""

    slot: str  # "on_success", "on_complete", or a chain step's number
    job_id: str
    job_type: str
    topic: str
    key: bytes | None
    value: bytes
    headers_json: str  # the record's headers but its enqueue and expiry times
    expires_in_ms: int | None


def template_of(slot: str, topic: str, record: JobRecord) -> JobTemplate:
    """The template of a prepared record. Refuses a delay: a callback or a later step
    starts when its turn comes."""
    if record.not_before_ms is not None:
        raise ConfigError(f"The {record.job_type} job of slot {slot!r} has a delay: a batch's "
                          "callback or a chain's later step starts when its turn comes, so "
                          "give it no delay or run_at.")
    timeless = [(name, value) for name, value in record.headers()
                if name not in (HEADER_ENQUEUED_AT, HEADER_EXPIRES_AT)]
    expires_in = (None if record.expires_at_ms is None
                  else max(0, record.expires_at_ms - record.enqueued_at_ms))
    return JobTemplate(slot, record.job_id, record.job_type, topic, record.key, record.payload,
                       encode_headers(timeless), expires_in)


def check_steps(count: int) -> None:
    if count < 1:
        raise ConfigError("A chain needs at least one job.")
    if count > 10_000:
        raise ConfigError(f"A chain of {count:,} steps is too long (at most 10,000): use a "
                          "batch, or a step that enqueues the rest.")


def distinct_ids(records: Sequence[JobRecord]) -> None:
    """Refuses two members with one job ID: the second would be a duplicate, and the
    batch would wait for it for ever."""
    seen: set[str] = set()
    for record in records:
        if record.job_id in seen:
            raise ConfigError(f"Two jobs of the batch have the job ID {record.job_id!r}: "
                              "a batch's members need distinct IDs.")
        seen.add(record.job_id)


__all__ = ["BatchSummary", "JobTemplate", "Membership", "callback_job_id", "parse_membership",
           "step_job_id", "template_of", "with_summary", "workflow_id_for"]
