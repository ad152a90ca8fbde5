"""The verdict of a batch-callback trial, from what the tables say. Pure.

The promise under test: a batch's callback runs once, after its last member, and sees the
right counts, however often members were retried or delivered again (kill -9 of workers
included). Counted from the trial's tables (ops/chaos/batch_app.py): every member has
exactly one effect row (none lost, none doubled); each callback that should run has
exactly one effect row, written after the last member's effect, with the batch's counts
in its payload; one that should not run has none.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class CallbackRow:
    """A row of `batch_callback_effects`."""

    job_id: str
    kind: str  # "success" or "complete"
    payload: dict[str, Any]
    at: datetime


@dataclass(frozen=True)
class BatchEvidence:
    batch_id: str
    member_ids: tuple[str, ...]
    member_effects: dict[str, int]  # job ID -> effect rows
    last_member_at: datetime | None
    callbacks: tuple[CallbackRow, ...]
    callback_runs: int  # deliveries of the callbacks (a kill may cause a second)
    expected_failed: int = 0  # members that should end dead-lettered


@dataclass
class BatchVerdict:
    members: int
    lost: int
    duplicate_effects: int
    callbacks: dict[str, int]
    callback_runs: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(evidence: BatchEvidence) -> BatchVerdict:
    """What the evidence shows, and every broken promise as a sentence."""
    members = set(evidence.member_ids)
    effects = evidence.member_effects
    lost = sum(1 for m in members if effects.get(m, 0) == 0) - evidence.expected_failed
    doubled = sum(n - 1 for m, n in effects.items() if m in members and n > 1)
    unknown = sum(n for m, n in effects.items() if m not in members)
    kinds = Counter(row.kind for row in evidence.callbacks)
    problems: list[str] = []
    if lost > 0:
        problems.append(f"{lost} members have no effect")
    if doubled:
        problems.append(f"{doubled} member effects happened twice")
    if unknown:
        problems.append(f"{unknown} effect rows belong to no member of the batch")
    total = len(members)
    failed = evidence.expected_failed
    wanted = {"complete": 1, "success": 1 if failed == 0 else 0}
    for kind, n in wanted.items():
        if kinds.get(kind, 0) != n:
            problems.append(f"the on_{kind} callback ran {kinds.get(kind, 0)} times, not {n}")
    for row in evidence.callbacks:
        if evidence.last_member_at is not None and row.at <= evidence.last_member_at:
            problems.append(f"the on_{row.kind} callback ran at {row.at.isoformat()}, before "
                            f"the last member's effect at {evidence.last_member_at.isoformat()}")
        seen = row.payload.get("batch") or {}
        counts = {"id": evidence.batch_id, "total": total, "succeeded": total - failed,
                  "failed": failed}
        if seen != counts:
            problems.append(f"the on_{row.kind} callback saw {seen}, not {counts}")
    return BatchVerdict(total, max(0, lost), doubled, dict(kinds), evidence.callback_runs,
                        problems)


__all__ = ["BatchEvidence", "BatchVerdict", "CallbackRow", "judge"]
