"""The verdict on a scheduler failover run, from its evidence. Pure: no Kafka, no Postgres.

- every firing of the window ran exactly once: each fire time from the first firing to
  the last has exactly one effect row (the effects table has no unique key), and no
  effect belongs to an ID that is not one of the schedule's firings;
- missed: fire times inside the window without an effect;
- failover gap, per fault: from the leader's death (SIGKILL) or freeze (SIGSTOP) to the
  next firing enqueued by anyone (the records' producer timestamps); takeover: from
  then to the moment another scheduler held the lock (sampled from `pg_locks`);
- lateness: per firing, its first enqueue less its fire time.
- enqueued twice: firings whose record is in the lane more than once (a leader that
  died or froze between its enqueue and its commit); each must be a `duplicate` outcome,
  not a second effect.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from stream_jobs.job_ids import job_id_time_ms
from stream_jobs.schedules import firing_job_id

PERIOD_MS = 1000


@dataclass(frozen=True)
class LeaderFault:
    """One fault on the leader: when it hit (epoch s), and when another took the lock."""

    kind: str  # "kill -9" or "SIGSTOP"
    at: float
    healed: float  # the replacement started, or SIGCONT
    takeover_s: float | None  # None: no other scheduler was seen holding the lock


@dataclass(frozen=True)
class FailoverEvidence:
    prefix: str
    job_type: str
    schedule: str
    enqueued: list[tuple[str, float]]  # (job ID, producer timestamp in epoch s) per record
    effects: list[str]  # the job ID of each effect row
    faults: list[LeaderFault]
    duplicate_outcomes: int  # counted by the workers that ran the firings


@dataclass
class FailoverVerdict:
    firings: int
    missed: list[int]  # fire times (Unix ms) with no effect
    duplicate_effects: int
    strangers: int
    enqueued_twice: int
    duplicate_outcomes: int
    gaps_s: list[float]
    takeovers_s: list[float | None]
    late_ms: list[float]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missed and self.duplicate_effects == 0 and self.strangers == 0 \
            and self.firings > 0 and not self.problems

    @property
    def gap_max_s(self) -> float | None:
        return max(self.gaps_s) if self.gaps_s else None

    def late(self, q: float) -> float | None:
        """The q-th percentile (0-100, nearest rank) of the firings' lateness, in ms."""
        if not self.late_ms:
            return None
        ordered = sorted(self.late_ms)
        return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered)) - 1))]


def judge(ev: FailoverEvidence) -> FailoverVerdict:
    problems: list[str] = []
    first_enqueue: dict[str, float] = {}
    for job_id, at in sorted(ev.enqueued, key=lambda pair: pair[1]):
        first_enqueue.setdefault(job_id, at)
    copies = Counter(job_id for job_id, _ in ev.enqueued)
    fire_of = {job_id: job_id_time_ms(job_id) for job_id in copies}
    strangers = [j for j, t in fire_of.items()
                 if t is None or firing_job_id(ev.prefix, ev.job_type, ev.schedule, t) != j]
    if strangers:
        problems.append(f"{len(strangers)} records are not firings of {ev.schedule!r}, e.g. "
                        f"{strangers[:3]}")
    times = sorted(t for j, t in fire_of.items() if t is not None and j not in strangers)
    expected = list(range(times[0], times[-1] + 1, PERIOD_MS)) if times else []
    ran = Counter(ev.effects)
    by_time = {fire_of.get(j): j for j in ran}
    missed = [t for t in expected if t not in by_time]
    if missed:
        problems.append(f"{len(missed)} firings of the window never ran, e.g. {missed[:3]}")
    effect_strangers = [j for j in ran if j not in copies]
    if effect_strangers:
        problems.append(f"effects for IDs never enqueued: {effect_strangers[:3]}")
    doubled = {j: n for j, n in ran.items() if n > 1}
    if doubled:
        problems.append(f"{len(doubled)} firings with their effect twice, e.g. "
                        f"{list(doubled.items())[:3]}")
    if not expected:
        problems.append("no firing was enqueued")
    enqueue_times = sorted(first_enqueue.values())
    gaps = []
    for fault in ev.faults:
        after = [t for t in enqueue_times if t > fault.at]
        if after:
            gaps.append(after[0] - fault.at)
        else:
            problems.append(f"no firing after the {fault.kind} at {fault.at:.1f}")
    late = [first_enqueue[j] * 1000 - t for j, t in fire_of.items()
            if t is not None and j not in strangers]
    return FailoverVerdict(
        firings=len(expected), missed=missed,
        duplicate_effects=sum(n - 1 for n in doubled.values()),
        strangers=len(strangers) + len(effect_strangers),
        enqueued_twice=sum(n - 1 for n in copies.values() if n > 1),
        duplicate_outcomes=ev.duplicate_outcomes, gaps_s=gaps,
        takeovers_s=[f.takeover_s for f in ev.faults], late_ms=late, problems=problems)


def summary(v: FailoverVerdict) -> str:
    """One line for logs and test output."""
    gaps = ", ".join(f"{g:.2f}" for g in v.gaps_s) or "-"
    takeovers = ", ".join("-" if t is None else f"{t:.2f}" for t in v.takeovers_s) or "-"
    p50, p99 = v.late(50), v.late(99)
    return (f"firings={v.firings} missed={len(v.missed)} dup_effects={v.duplicate_effects} "
            f"enqueued_twice={v.enqueued_twice} duplicate_outcomes={v.duplicate_outcomes} "
            f"gaps_s=[{gaps}] takeovers_s=[{takeovers}] late_ms p50="
            f"{'-' if p50 is None else f'{p50:.0f}'} p99={'-' if p99 is None else f'{p99:.0f}'}"
            f" median_gap_s={f'{statistics.median(v.gaps_s):.2f}' if v.gaps_s else '-'}")
