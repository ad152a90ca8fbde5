"""The rows of the lists of waiting jobs, and which list a record belongs to. Pure.

- `pending`: a record of a lane at or after the worker group's committed offset (it
  waits for a worker, or is running now: the committed offset is the lowest one not
  finished);
- `scheduled`: a record of a delay tier at or after the relay group's committed offset,
  with attempt 1 and no failure: a job enqueued with a delay;
- `retrying`: any other such tier record: a failed job waiting for its next attempt;
- `dead`: a job (not a letter) in the DLQ, with the reason of its newest letter.

The tier rule is `stream_jobs.lookup`'s (`tier_state`), so `stream-jobs job` and these
lists never disagree about a job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stream_jobs.dlq.tally import JobLetters
from stream_jobs.failures import FailureInfo
from stream_jobs.lookup import headers_of, number_of, sighting_from, tier_state
from stream_jobs.naming import TopicRole
from stream_jobs.record import HEADER_ENQUEUED_AT, HEADER_JOB_ID, Record

State = Literal["pending", "scheduled", "retrying", "dead"]
STATES: tuple[State, ...] = ("pending", "scheduled", "retrying", "dead")


def state_named(name: str) -> State:
    """The list called `name`; ValueError when there is none."""
    for state in STATES:
        if state == name:
            return state
    raise ValueError(f"There is no list of {name!r} jobs; the lists are {', '.join(STATES)}.")


@dataclass(frozen=True)
class WaitingRow:
    """One job waiting in a lane or a delay tier: one record."""

    job_id: str
    state: State
    place: str  # the lane ("default") or the tier ("1m")
    partition: int
    offset: int
    attempt: int
    timestamp_ms: int  # when the record was appended
    enqueued_at_ms: int | None
    due_ms: int | None  # a tier record's not-before time
    failure: FailureInfo | None  # a retry's last error

    @property
    def order(self) -> tuple[int, str, int, int]:
        """The page order: due time in the tiers, append time in the lanes."""
        at = self.due_ms if self.due_ms is not None else self.timestamp_ms
        return (at, self.place, self.partition, self.offset)

    def age_s(self, now_ms: int) -> float:
        """How long the job has waited since it was enqueued (appended, without the header)."""
        since = self.enqueued_at_ms if self.enqueued_at_ms is not None else self.timestamp_ms
        return max(0.0, (now_ms - since) / 1000)

    def to_dict(self, now_ms: int) -> dict[str, object]:
        return {"job_id": self.job_id, "state": self.state, "place": self.place,
                "partition": self.partition, "offset": self.offset, "attempt": self.attempt,
                "appended_at_ms": self.timestamp_ms, "enqueued_at_ms": self.enqueued_at_ms,
                "age_s": round(self.age_s(now_ms), 3), "due_ms": self.due_ms,
                "error_class": self.failure.error_class if self.failure else None,
                "message": self.failure.message if self.failure else None}


def row_of(record: Record, *, role: TopicRole, name: str) -> WaitingRow:
    """The row a lane or tier record is (headers that do not parse are left out)."""
    found = headers_of(record)
    seen = sighting_from(record, found, role=role, name=name, committed=None)
    raw_id = found.get(HEADER_JOB_ID)
    return WaitingRow(
        job_id="" if raw_id is None else raw_id.decode(errors="replace"),
        state="pending" if role != "tier" else tier_state(seen), place=name,
        partition=seen.partition, offset=seen.offset, attempt=seen.attempt,
        timestamp_ms=seen.timestamp_ms,
        enqueued_at_ms=number_of(found.get(HEADER_ENQUEUED_AT)),
        due_ms=seen.not_before_ms if role == "tier" else None, failure=seen.failure)


@dataclass(frozen=True)
class DeadRow:
    """One dead-lettered job: its newest letter, and how many letters it has."""

    job_id: str  # "" for a letter without a readable ID (its own job)
    reason: str
    failed_at_ms: int
    requeues: int
    letters: int
    partition: int
    offset: int

    @property
    def place(self) -> tuple[int, int, int]:
        """The dead list's order, newest first: its keyset."""
        return (self.failed_at_ms, self.partition, self.offset)

    @classmethod
    def of(cls, key: str, job: JobLetters) -> DeadRow:
        return cls(job_id="" if key.startswith("\0") else key, reason=job.reason,
                   failed_at_ms=job.failed_at_ms, requeues=job.rank[0], letters=job.letters,
                   partition=job.position[0], offset=job.position[1])

    def to_dict(self) -> dict[str, object]:
        return {"job_id": self.job_id, "state": "dead", "reason": self.reason,
                "failed_at_ms": self.failed_at_ms, "requeues": self.requeues,
                "letters": self.letters, "partition": self.partition, "offset": self.offset}


__all__ = ["STATES", "DeadRow", "State", "WaitingRow", "row_of", "state_named"]
