"""The LISTEN trial's checker (ops/chaos/listen_trial.py), pure: what the run left
behind in, the verdict out."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# A cancel sent into a silent LISTEN link interrupts its job within this many seconds of
# the link's return (docs/control.md: the probe's 10 s find the silence during the fault;
# afterwards the watch's backoff, at most 5 s, and a reload; the rest is margin).
INTERRUPT_BOUND_S = 10.0


@dataclass(frozen=True)
class ListenEvidence:
    healed_at: float  # epoch s: the link back
    cancelled: dict[str, float]  # hold job -> when its cancel was answered "cancelled"
    interrupts: dict[str, float]  # hold job -> when its handler was interrupted (first)
    work: dict[str, int]  # work job -> its number (enqueued directly or through the outbox)
    effects: list[str]  # work job IDs, one per effect row
    waited: dict[str, object]  # work job -> what client.result() returned


@dataclass
class ListenVerdict:
    interrupted_late: int = 0
    not_interrupted: int = 0
    worst_interrupt_s: float | None = None  # after the link's return
    lost: int = 0
    duplicate_effects: int = 0
    wrong_results: int = 0
    problems: list[str] = field(default_factory=list)


def judge(ev: ListenEvidence) -> ListenVerdict:
    v = ListenVerdict()
    after = [ev.interrupts[j] - ev.healed_at for j in ev.cancelled if j in ev.interrupts]
    v.not_interrupted = sum(1 for j in ev.cancelled if j not in ev.interrupts)
    v.interrupted_late = sum(1 for s in after if s > INTERRUPT_BOUND_S)
    v.worst_interrupt_s = max(after) if after else None
    counts = Counter(ev.effects)
    v.lost = sum(1 for j in ev.work if counts[j] == 0)
    v.duplicate_effects = sum(n - 1 for n in counts.values() if n > 1)
    v.wrong_results = sum(1 for j, got in ev.waited.items() if got != ev.work.get(j, -1) * 2)
    if not ev.cancelled:
        v.problems.append("no cancel was sent into the silent link: the run proved nothing")
    if v.not_interrupted:
        v.problems.append(f"{v.not_interrupted} cancelled jobs were never interrupted")
    if v.interrupted_late:
        v.problems.append(f"{v.interrupted_late} cancelled jobs were interrupted later than "
                          f"{INTERRUPT_BOUND_S:.0f} s after the link returned")
    if v.lost:
        v.problems.append(f"{v.lost} work jobs (direct or through the outbox) have no effect")
    if v.duplicate_effects:
        v.problems.append(f"{v.duplicate_effects} effects written twice")
    if v.wrong_results:
        v.problems.append(f"{v.wrong_results} result waits returned something else")
    if len(ev.waited) == 0:
        v.problems.append("no result wait answered")
    return v


__all__ = ["INTERRUPT_BOUND_S", "ListenEvidence", "ListenVerdict", "judge"]
