"""The verdict of a fairness trial (ops/chaos/fairness.py), from its plan, its effect rows
and the overflow lane. Pure.

The promises under test: while tenants move to and from the overflow lane and workers
are killed with SIGKILL, no job is lost, none has its effect twice, and a key's jobs take
effect in the order they were enqueued, whatever tenants share the key and whichever
lane each went through. Order kept: for each key, its jobs' first effects, in the order
they were inserted, carry increasing sequence numbers; the effects of retries are left
out (a failing job leaves for a delay tier, so ordering is promised for jobs that succeed
first time: a Postgres restart makes jobs fail and retry). A job that left for a delay
tier failed its first attempt even when the effect row says attempt 1: a worker killed
after sending it there, before its commit, leaves the first-attempt record to be read
again, and that copy may be the one that takes effect. A run in which no job went through
the overflow lane proved nothing about it, and says so.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass(frozen=True)
class Planned:
    """One job of the plan: its tenant, its key, and its place among the key's jobs."""

    tenant: str
    key: str
    seq: int


@dataclass(frozen=True)
class EffectRow:
    """A row of `fair_effects` (ops/chaos/fair_app.py); `at` in epoch seconds."""

    job_id: str
    key: str
    seq: int
    at: float
    attempt: int = 1  # the attempt that wrote it


@dataclass(frozen=True)
class FairEvidence:
    enqueued: dict[str, Planned]  # job ID -> what it was
    effects: tuple[EffectRow, ...]
    overflowed: int  # records written to the type's overflow lane
    # Job IDs with a record in a delay tier or the DLQ: their first attempt failed.
    delayed: frozenset[str] = frozenset()


@dataclass
class FairVerdict:
    jobs: int
    lost: int
    duplicate_effects: int
    keys_out_of_order: int
    overflowed: int
    problems: list[str] = field(default_factory=list)
    retried: int = 0  # jobs whose effect a later attempt wrote (out of the order check)

    @property
    def ok(self) -> bool:
        return not self.problems


def out_of_order(effects: tuple[EffectRow, ...], delayed: frozenset[str] = frozenset()
                 ) -> dict[str, list[int]]:
    """Keys whose jobs' first effects, by insert time, do not carry increasing sequence
    numbers: each with its sequence numbers in that order. Only jobs that succeeded first
    time count: a failing job leaves for a delay tier, so its retry may run after later
    jobs of its key (the ordering promise is for jobs that succeed first time); those are
    the effects of later attempts and the jobs in `delayed`."""
    first: dict[str, EffectRow] = {}
    for row in (r for r in effects if r.attempt == 1 and r.job_id not in delayed):
        if row.job_id not in first or row.at < first[row.job_id].at:
            first[row.job_id] = row
    by_key: dict[str, list[EffectRow]] = defaultdict(list)
    for row in first.values():
        by_key[row.key].append(row)
    found = {}
    for key, rows in sorted(by_key.items()):
        seqs = [row.seq for row in sorted(rows, key=lambda r: (r.at, r.seq))]
        if any(b <= a for a, b in pairwise(seqs)):
            found[key] = seqs
    return found


def judge(evidence: FairEvidence) -> FairVerdict:
    """What the evidence shows, and every broken promise as a sentence."""
    counts = Counter(row.job_id for row in evidence.effects)
    enqueued = evidence.enqueued
    lost = sorted(j for j in enqueued if counts[j] == 0)
    doubled = {j: n for j, n in counts.items() if n > 1}
    strangers = sorted(set(counts) - set(enqueued))
    disordered = out_of_order(evidence.effects, evidence.delayed)
    problems: list[str] = []
    if lost:
        problems.append(f"{len(lost)} jobs have no effect, e.g. {lost[:3]}")
    if doubled:
        problems.append(f"{len(doubled)} jobs had their effect more than once, e.g. "
                        f"{list(doubled.items())[:3]}")
    if strangers:
        problems.append(f"effects of job IDs never enqueued, e.g. {strangers[:3]}")
    for key, seqs in list(disordered.items())[:3]:
        problems.append(f"key {key}: effects in the order {_excerpt(seqs)}")
    if len(disordered) > 3:
        problems.append(f"{len(disordered)} keys out of order in all")
    if evidence.overflowed == 0:
        problems.append("no job went through the overflow lane: the run proved nothing "
                        "about it")
    retried = len({r.job_id for r in evidence.effects if r.attempt > 1} | evidence.delayed)
    return FairVerdict(len(enqueued), len(lost), sum(n - 1 for n in doubled.values()),
                       len(disordered), evidence.overflowed, problems, retried)


def _excerpt(seqs: list[int]) -> str:
    """The sequence numbers around the first step that goes back."""
    at = next(i for i, (a, b) in enumerate(pairwise(seqs)) if b <= a)
    shown = seqs[max(0, at - 2):at + 4]
    return ", ".join(map(str, shown))


__all__ = ["EffectRow", "FairEvidence", "FairVerdict", "Planned", "judge", "out_of_order"]
