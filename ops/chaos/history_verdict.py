"""The verdict of a history trial (ops/chaos/history_trial.py), from what the history
says once caught up, what the workers reported, what happened (effect rows, dead
letters) and what the killed workers ended just before they died. Pure.

What docs/history.md promises, and so what is judged:

- the minute windows, the hour windows and the running total say the same counts, and
  they add up to what the workers counted, **exactly, across kills of the history
  process** (a report folded twice adds nothing). The workers' counts are what their
  reports on `P._stats` say, each (worker, slot) as its latest report has it: the
  runner adds those up by itself, and the history must say exactly that;
- but **a worker killed with SIGKILL loses the counts of its last report interval**, as
  its own counters do ("Limits"): what it ended after its last report that reached Kafka
  was never reported. So the workers' reports, and the history, may count fewer than
  happened, by at most what each killed worker ended in its last moments before it died
  (`allowance`, measured by the runner from the rows' worker pids and times). More than
  happened, or fewer than that allows, is a broken promise.

Counted against what happened, per outcome the trial makes happen: `succeeded` (effect
rows, one per job through `ctx.once()`) and `dead_lettered` (the records of the type's
DLQ topic: a failing job redelivered after a kill is dead-lettered again, and counted
again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

OUTCOMES = ("succeeded", "dead_lettered")


@dataclass(frozen=True)
class HistoryEvidence:
    truth: dict[str, int]  # outcome -> how many happened
    allowance: dict[str, int]  # outcome -> ended by a killed worker just before it died
    reported: dict[str, int]  # outcome -> the workers' latest reports, added up
    totals: dict[str, int]  # the history's running total
    minutes: dict[str, int]  # the minute windows', added up
    hours: dict[str, int]  # the hour windows', added up
    counted_at_history_kills: tuple[int, ...] = ()  # the running total's jobs at each
    duplicate_effects: int = 0


@dataclass
class HistoryVerdict:
    truth: dict[str, int]
    reported: dict[str, int]
    counted: dict[str, int]
    short: dict[str, int]  # truth - counted, per outcome of OUTCOMES
    allowance: dict[str, int]
    history_kills_mid_stream: int
    duplicate_effects: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _only(outcomes: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in outcomes.items() if v}


def _against_truth(e: HistoryEvidence) -> list[str]:
    problems: list[str] = []
    for outcome in OUTCOMES:
        truth, reported = e.truth.get(outcome, 0), e.reported.get(outcome, 0)
        allowed = e.allowance.get(outcome, 0)
        if reported > truth:
            problems.append(f"the workers reported {reported} {outcome}, {reported - truth} "
                            f"more than happened ({truth})")
        elif truth - reported > allowed:
            problems.append(f"the workers reported {reported} {outcome} of {truth}: "
                            f"{truth - reported} short, more than the {allowed} the killed "
                            "workers ended just before they died")
    return problems


def judge(evidence: HistoryEvidence, *, history_kills: int = 0) -> HistoryVerdict:
    """What the evidence shows, and every broken promise as a sentence. `history_kills`:
    how many kills of the history process the run meant to make while it counted."""
    e = evidence
    totals = _only(e.totals)
    problems: list[str] = []
    for name, seen in (("the minute windows", e.minutes), ("the hour windows", e.hours)):
        if _only(seen) != totals:
            problems.append(f"{name} say {_only(seen)}, the running total {totals}")
    if totals != _only(e.reported):
        problems.append(f"the history counts {totals}, the workers reported "
                        f"{_only(e.reported)}")
    problems += _against_truth(e)
    if e.duplicate_effects:
        problems.append(f"{e.duplicate_effects} effects happened twice")
    final = sum(totals.values())
    mid_stream = sum(1 for c in e.counted_at_history_kills if 0 < c < final)
    if mid_stream < history_kills:
        problems.append(f"only {mid_stream} of {history_kills} kills of the history process "
                        "came while it had counted some jobs and not all: the others tested "
                        "nothing")
    return HistoryVerdict(
        dict(e.truth), {o: e.reported.get(o, 0) for o in OUTCOMES},
        {o: e.totals.get(o, 0) for o in OUTCOMES},
        {o: e.truth.get(o, 0) - e.totals.get(o, 0) for o in OUTCOMES}, dict(e.allowance),
        mid_stream, e.duplicate_effects, problems)


__all__ = ["OUTCOMES", "HistoryEvidence", "HistoryVerdict", "judge"]
