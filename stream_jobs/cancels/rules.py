"""Cancelling a job: the answers, the rule that makes done and cancelled exclusive, and the
notice that reaches workers. Pure (no database, no Kafka).

The dedup table is the single arbiter. A cancel inserts the job's dedup row itself (with
attempt 0, the marker: no run committed it) in the same transaction as its row in
`stream_jobs_cancels`:

- if the row already exists, an earlier run committed its `ctx.once()` effects (or an
  earlier cancel got there first): the cancel changes nothing and says so;
- if the insert wins, every later `ctx.once()` claim of that ID conflicts, so no run can
  commit effects any more, and the job finishes as `cancelled`.

Two inserts of one primary key serialise, so a cancel racing a run's commit is one or the
other, never both. Workers also keep the cancelled IDs of their type in memory (loaded at
start, kept current by the NOTIFY each cancel sends), so a cancelled job is finished
before it starts without a query, and a running one is interrupted.

A run inside `ctx.once()` holds its claim on the dedup row until its transaction ends, so
a cancel's insert would wait for it. The cancel waits `CLAIM_WAIT_S` at most; then it
asks the workers to interrupt that run (an `interrupt` notice: its transaction rolls
back, its claim with it) and inserts again, waiting for the claim's end: it wins if the
run rolled back, and answers "already finished" if the run committed first.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

from stream_jobs.errors import ConfigError

# The dedup row a cancel writes has this attempt: no run's, so `stream-jobs job` and the
# result API can tell a cancel marker from a committed run.
MARKER_ATTEMPT = 0
MAX_REASON_CHARS = 500
# How long a cancel waits for a run's open claim before asking for an interrupt (a group
# commit batch normally ends well within it), then for the interrupted run to roll back.
CLAIM_WAIT_S = 0.05
INTERRUPT_WAIT_S = 30.0
_CHANNEL_MAX = 63  # Postgres keeps 63 bytes of an identifier; a LISTEN channel is one
# Lookup statuses (stream_jobs.lookup) of jobs that reached an outcome already.
_FINISHED_STATUSES = frozenset({"done", "finished", "dead_lettered", "cancelled",
                                "superseded"})
_WAITING_STATUSES = frozenset({"pending", "running", "retrying", "scheduled"})


class CancelAnswer(StrEnum):
    """What a cancel did."""

    CANCELLED = "cancelled"  # the marker is written: the job never starts, or is stopped
    ALREADY_CANCELLED = "already_cancelled"  # an earlier cancel wrote it; nothing changed
    ALREADY_FINISHED = "already_finished"  # it reached its outcome; nothing changed


@dataclass(frozen=True, slots=True)
class Cancellation:
    """The answer to one cancel, with the sentence a person reads."""

    job_id: str
    answer: CancelAnswer
    job_type: str | None = None
    reason: str | None = None
    detail: str = ""

    @property
    def changed(self) -> bool:
        return self.answer is CancelAnswer.CANCELLED

    def summary(self) -> str:
        job = f"Job {self.job_id}" + (f" ({self.job_type})" if self.job_type else "")
        if self.answer is CancelAnswer.CANCELLED:
            text = (f"{job} is cancelled: it will not start, and a run in progress is "
                    "interrupted.")
        elif self.answer is CancelAnswer.ALREADY_CANCELLED:
            text = f"{job} was already cancelled; nothing changed."
        else:
            text = f"{job} already finished; nothing changed."
        return f"{text} {self.detail}".rstrip()


def checked_reason(reason: str | None) -> str | None:
    """`reason` as stored (stripped, None when empty); ConfigError when it is too long."""
    if reason is None:
        return None
    text = reason.strip()
    if len(text) > MAX_REASON_CHARS:
        raise ConfigError(f"A cancel reason is at most {MAX_REASON_CHARS} characters "
                         f"(this one has {len(text)}).")
    return text or None


def channel(schema: str) -> str:
    """The NOTIFY channel of cancels in `schema`: cancels notify it in their transaction
    (delivered at commit), the workers of that schema listen."""
    name = f"stream_jobs_cancel.{schema}"
    if len(name.encode()) <= _CHANNEL_MAX:
        return name
    return "stream_jobs_cancel." + hashlib.sha256(schema.encode()).hexdigest()[:32]


class NoticeKind(StrEnum):
    """What a NOTIFY on the cancel channel says."""

    CANCEL = "cancel"  # committed: the job is cancelled
    INTERRUPT = "interrupt"  # a cancel waits for this job's open ctx.once(): stop that run
    # `stream-jobs retry-now` wrote a copy of one attempt to its lane (stream_jobs/retry_now/):
    # its tier record is not to run. The notice's job part is `released_text(...)`.
    RELEASED = "released"


# (job ID, requeues, attempt): one attempt of one round of a job, released early.
ReleasedKey = tuple[str, int, int]


def released_text(key: ReleasedKey) -> str:
    """The job part of a RELEASED notice: requeues, attempt and job ID, tab-separated
    (the ID last, kept whole)."""
    job_id, requeues, attempt = key
    return f"{requeues}\t{attempt}\t{job_id}"


def released_key(text: str) -> ReleasedKey | None:
    """The key in `released_text` output; None for anything else."""
    parts = text.split("\t", 2)
    if len(parts) != 3 or not parts[2] or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return parts[2], int(parts[0]), int(parts[1])


@dataclass(frozen=True, slots=True)
class Notice:
    kind: NoticeKind
    job_type: str  # "" when the canceller did not say
    job_id: str


def notice(kind: NoticeKind, job_type: str, job_id: str) -> str:
    """The NOTIFY payload: kind, type ("" when not given) and job ID, tab-separated.
    Job types never hold a tab; a job ID may (it is last, so it is kept whole)."""
    return f"{kind}\t{job_type}\t{job_id}"


def parse_notice(payload: str) -> Notice | None:
    """The `Notice` in `notice` output; None for anything else."""
    parts = payload.split("\t", 2)
    if len(parts) != 3 or not parts[2]:
        return None
    try:
        kind = NoticeKind(parts[0])
    except ValueError:
        return None
    return Notice(kind, parts[1], parts[2])


def concerns(job_type: str, own_type: str) -> bool:
    """Whether a cancel given for `job_type` ("" when unnamed) may be for a job of `own_type`."""
    return job_type in ("", own_type)


def verdict_of(status: str) -> CancelAnswer | None:
    """What a job's lookup status (`stream_jobs.lookup`) means for a cancel: an
    answer without writing anything, or None when the job may still start (write the
    marker). `not_seen` is neither: the caller says the ID is unknown."""
    if status == "cancelled":
        return CancelAnswer.ALREADY_CANCELLED
    if status in _FINISHED_STATUSES:
        return CancelAnswer.ALREADY_FINISHED
    if status in _WAITING_STATUSES:
        return None
    raise ValueError(f"no cancel verdict for status {status!r}")


__all__ = ["CLAIM_WAIT_S", "INTERRUPT_WAIT_S", "MARKER_ATTEMPT", "CancelAnswer",
           "Cancellation", "Notice", "NoticeKind", "ReleasedKey", "channel", "checked_reason",
           "concerns", "notice", "parse_notice", "released_key", "released_text",
           "verdict_of"]
