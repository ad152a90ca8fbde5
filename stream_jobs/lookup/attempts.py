"""A job's attempts, in order, from what its lookup found (`JobLocation`). Pure.

Each failed attempt is told by the record written after it: its retry in a delay tier
(which carries the next attempt's number and, in `sj-error`, this attempt's failure: the
worker that ran it, when it started, how long it ran, its error) or its dead letter.
Between attempts, the tier it waited in and until when (the tier record's `not_before`);
a job enqueued with a delay waits in a tier before its first attempt the same way.

The attempt that succeeded is told by the dedup row (or the row of kept results): its
number and when it committed. Which worker ran it and how long it took are not recorded
anywhere, and are shown as such rather than guessed. A lane record with nothing after it
is an attempt waiting or running, or one that ended without a row (succeeded without
`ctx.once()`, or expired).

After a dead letter is requeued the attempts count again from 1: `requeues` tells the
rounds apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from stream_jobs.failures import FailureInfo
from stream_jobs.lookup.location import JobLocation, Sighting

StepKind = Literal["attempt", "wait"]
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Step:
    """One row of a job's story: an attempt, or a wait in a delay tier before one."""

    kind: StepKind
    attempt: int
    requeues: int = 0
    outcome: str = ""  # an attempt's: "failed, retried", "dead-lettered", "succeeded", ...
    failure: FailureInfo | None = None
    committed_at: datetime | None = None  # the successful attempt's, from its dedup row
    tier: str | None = None  # a wait's
    until_ms: int | None = None  # a wait's: its due time
    released: bool = False  # a wait's: the relay passed it on to the lane

    @property
    def worker_id(self) -> str | None:
        return None if self.failure is None else self.failure.worker_id

    @property
    def started_at_ms(self) -> int | None:
        return None if self.failure is None else self.failure.started_at_ms

    @property
    def duration_ms(self) -> int | None:
        return None if self.failure is None else self.failure.duration_ms


def steps_of(location: JobLocation) -> list[Step]:
    """The job's attempts and the waits between them, oldest first."""
    attempts: dict[tuple[int, int], Step] = {}
    waits: dict[tuple[int, int], Step] = {}
    for seen in sorted(location.sightings, key=_order):
        round_ = seen.requeues
        if seen.role == "lane":
            attempts.setdefault((round_, seen.attempt), _lane_attempt(seen))
            continue
        if seen.role == "overflow":  # moved on from its lane: the same attempt, told here
            attempts[(round_, seen.attempt)] = _lane_attempt(seen)
            continue
        if seen.failure is not None:
            failed = seen.attempt - 1 if seen.role == "tier" else seen.attempt
            outcome = "failed, retried" if seen.role == "tier" else "failed, dead-lettered"
            if failed >= 1:
                attempts[(round_, failed)] = Step("attempt", failed, round_, outcome,
                                                  seen.failure)
        if seen.role == "tier":
            waits[(round_, seen.attempt)] = Step("wait", seen.attempt, round_,
                                                 tier=seen.name, until_ms=seen.not_before_ms,
                                                 released=seen.behind_commit)
        elif seen.failure is None:  # a dead letter that no run made (it did not decode)
            attempts[(round_, seen.attempt)] = Step("attempt", seen.attempt, round_,
                                                    "dead-lettered without a run")
    success = _success(location)
    if success is not None:
        last_round = max((key[0] for key in attempts), default=0)
        attempts[(last_round, success[0])] = Step("attempt", success[0], last_round,
                                                  "succeeded", committed_at=success[1])
    steps: list[Step] = []
    for key in sorted(attempts.keys() | waits.keys()):
        if key in waits:
            steps.append(waits[key])
        if key in attempts:
            steps.append(attempts[key])
    return steps


def _success(location: JobLocation) -> tuple[int, datetime | None] | None:
    """(attempt, when it committed) of the attempt that succeeded: the dedup row's, else
    the row of kept results'."""
    if location.status == "done" and location.attempt:
        return location.attempt, location.finished_at
    result = location.result
    if result is not None and result.succeeded and result.attempt:
        return result.attempt, result.finished_at
    return None


def _order(seen: Sighting) -> tuple[int, int, int, int]:
    role = {"tier": 0, "lane": 1, "overflow": 2, "dlq": 3}[seen.role]
    return seen.requeues, seen.attempt, seen.timestamp_ms, role


def _lane_attempt(seen: Sighting) -> Step:
    outcome = ("ended without a recorded outcome" if seen.behind_commit
               else "waiting or running")
    return Step("attempt", seen.attempt, seen.requeues, outcome)


__all__ = ["NOT_RECORDED", "Step", "StepKind", "steps_of"]
