"""The verdict of a unique-keys trial (ops/chaos/unique_trial.py), from every enqueue call
and every effect row. Pure.

The promise under test (docs/control.md, "Unique jobs"): while a job holding the key is
pending (enqueued and not finished), another enqueue with the key sends nothing and
answers that job's ID; the key is held from the enqueue until the job finished (no
`unique_for` here). Not promised, so not checked: when after its job finished a key is
given back (a worker killed before giving it back leaves it held until the job's
redelivery finishes as a duplicate).

What is certain of a job's time holding its key: it is held at least from the earlier of
its enqueue call's return and its committed attempt's start, until its effect row's
insert (the run commits after it). Two jobs of one key whose certain times overlap were
pending together: the key let two through. Beside that: every call that was told "sent"
has exactly one effect (none lost, none doubled); a call told "not sent" sent nothing and
named a job of the same key that was enqueued before the call returned; a call that
failed (Postgres restarting) may or may not have sent its job, which then runs once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Call:
    """One enqueue with a unique key, as its producer saw it (epoch seconds)."""

    producer: int
    call: int
    key: str
    job_id: str  # the ID it asked for
    started: float
    returned: float
    answer: str | None = None  # the ID it was answered; None when it failed
    sent: bool = False
    error: str = ""


@dataclass(frozen=True)
class EffectRow:
    """A row of `unique_effects` (ops/chaos/unique_app.py), times in epoch seconds."""

    job_id: str
    key: str
    started: float  # its committed attempt's start
    at: float  # the row's insert, just before the run committed


@dataclass(frozen=True)
class UniqueEvidence:
    calls: tuple[Call, ...]
    effects: tuple[EffectRow, ...]


@dataclass
class UniqueVerdict:
    calls: int
    sent: int
    refused: int
    failed: int  # calls that raised and were made again
    sent_unanswered: int  # failed calls whose job ran all the same
    lost: int
    duplicate_effects: int
    overlaps: int  # pairs of one key's jobs pending at the same time
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def held_spans(evidence: UniqueEvidence) -> dict[str, list[tuple[float, float, str]]]:
    """Per key, each job's certain time holding it: (from, to, job ID), by `from`."""
    returned = {c.job_id: c.returned for c in evidence.calls if c.sent}
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for e in evidence.effects:
        spans[e.key].append((min(returned.get(e.job_id, e.started), e.started), e.at,
                             e.job_id))
    return {key: sorted(found) for key, found in spans.items()}


def overlapping(spans: dict[str, list[tuple[float, float, str]]]
                ) -> list[tuple[str, str, str]]:
    """(key, job, job) for each two jobs of a key whose held times overlap."""
    found: list[tuple[str, str, str]] = []
    for key, held in spans.items():
        for i, (_, hi, job) in enumerate(held):  # by `from`: later ones start after it
            found += [(key, job, other) for lo, _, other in held[i + 1:]
                      if lo < hi and other != job]
    return found


def _answer_problems(evidence: UniqueEvidence) -> list[str]:
    by_id = {c.job_id: c for c in evidence.calls}
    ran = {e.job_id for e in evidence.effects}
    wrong: list[str] = []
    for c in evidence.calls:
        if c.answer is None:
            continue
        if c.sent and c.answer != c.job_id:
            wrong.append(f"call {c.producer}.{c.call} was told its job {c.answer} was sent, "
                         f"not the {c.job_id} it asked for")
        holder = by_id.get(c.answer)
        if not c.sent and (holder is None or holder.key != c.key
                           or holder.started >= c.returned
                           or not (holder.sent or holder.job_id in ran)):
            wrong.append(f"call {c.producer}.{c.call} (key {c.key}) was refused in favour of "
                         f"{c.answer}, which is no job of that key enqueued before it")
    return [f"{len(wrong)} enqueue answers name the wrong job (e.g. {wrong[0]})"] if wrong else []


def judge(evidence: UniqueEvidence) -> UniqueVerdict:
    """What the evidence shows, and every broken promise as a sentence."""
    calls = evidence.calls
    sent = {c.job_id for c in calls if c.sent}
    refused = {c.job_id for c in calls if c.answer is not None and not c.sent}
    failed = {c.job_id for c in calls if c.answer is None}
    runs = Counter(e.job_id for e in evidence.effects)
    lost = sorted(sent - set(runs))
    doubled = sum(n - 1 for n in runs.values() if n > 1)
    leaked = sorted(refused & set(runs))
    strangers = sorted(set(runs) - sent - refused - failed)
    overlaps = overlapping(held_spans(evidence))
    problems: list[str] = []
    if lost:
        problems.append(f"{len(lost)} jobs told sent never ran (e.g. {lost[0]})")
    if doubled:
        problems.append(f"{doubled} effects happened twice")
    if leaked:
        problems.append(f"{len(leaked)} enqueues told \"not sent\" ran all the same "
                        f"(e.g. {leaked[0]})")
    if strangers:
        problems.append(f"{len(strangers)} jobs ran that no call enqueued (e.g. {strangers[0]})")
    if overlaps:
        key, a, b = overlaps[0]
        problems.append(f"{len(overlaps)} times a unique key let a second job through while "
                        f"one was pending (e.g. key {key}: {a} and {b})")
    problems += _answer_problems(evidence)
    return UniqueVerdict(len(calls), len(sent), len(refused), len(failed),
                         len(failed & set(runs)), len(lost), doubled, len(overlaps), problems)


__all__ = ["Call", "EffectRow", "UniqueEvidence", "UniqueVerdict", "held_spans", "judge",
           "overlapping"]
