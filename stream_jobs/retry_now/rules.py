"""Retry now, the pure part: which jobs may be released early, the mark on the copy, the
check that finds an original in a lane, and the answer a person reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stream_jobs.cancels.rules import ReleasedKey
from stream_jobs.record import HEADER_ATTEMPT, HEADER_JOB_ID, HEADER_REQUEUES

# On the copy retry-now writes to the lane: the one record of that attempt that runs.
HEADER_RELEASED_EARLY = "sj-released-early"
EARLY_MARK = (HEADER_RELEASED_EARLY, b"1")
# Lookup statuses (stream_jobs.lookup) of a job waiting in a delay tier.
WAITING_IN_A_TIER = frozenset({"retrying", "scheduled"})
_SAID = {"done": "done", "finished": "finished", "pending": "pending (or running)",
         "dead_lettered": "dead-lettered (requeue it instead)", "cancelled": "cancelled",
         "superseded": "superseded by a newer job of its debounce key"}


def refusal(job_id: str, status: str) -> str | None:
    """Why a job with this lookup status cannot be retried now; None when it can."""
    if status in WAITING_IN_A_TIER:
        return None
    return f"Job {job_id} is {_SAID.get(status, status)}, not waiting in a delay tier."


def released_original(headers: Sequence[tuple[str, bytes]], released: set[ReleasedKey]
                      ) -> bool:
    """Whether a lane record with `headers` is the original of an attempt released
    early: its (job ID, requeues, attempt) is in `released` and it lacks the early mark.
    Only called when `released` is not empty."""
    job_id = requeues = attempt = None
    for name, value in headers:
        if name == HEADER_RELEASED_EARLY:
            return False
        if name == HEADER_JOB_ID:
            job_id = value
        elif name == HEADER_ATTEMPT:
            attempt = value
        elif name == HEADER_REQUEUES:
            requeues = value
    if job_id is None:
        return False
    key = (job_id.decode(errors="replace"), _number(requeues, 0), _number(attempt, 1))
    return key in released


def _number(raw: bytes | None, default: int) -> int:
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 18 else default


@dataclass(frozen=True)
class EarlyRelease:
    """What one retry-now did."""

    job_id: str
    job_type: str
    attempt: int
    tier: str
    due_ms: int | None  # when it would have run
    lane_topic: str
    partition: int
    offset: int

    def summary(self) -> str:
        first = "its first attempt" if self.attempt == 1 else f"attempt {self.attempt}"
        return (f"Job {self.job_id} ({self.job_type}) runs now: {first} was written to "
                f"{self.lane_topic} (partition {self.partition}, offset {self.offset}); "
                f"its record in delay tier {self.tier} will not run.")

    def to_dict(self) -> dict[str, object]:
        return {"job_id": self.job_id, "job_type": self.job_type, "attempt": self.attempt,
                "tier": self.tier, "due_ms": self.due_ms, "lane_topic": self.lane_topic,
                "partition": self.partition, "offset": self.offset,
                "summary": self.summary()}


__all__ = ["EARLY_MARK", "HEADER_RELEASED_EARLY", "WAITING_IN_A_TIER", "EarlyRelease",
           "refusal", "released_original"]
