"""The verdict of a results trial (ops/chaos/results_trial.py), from the kept results, the
effect rows and what the waiting clients got. Pure.

The promises under test (docs/results.md): a job's result is committed in the transaction
of its dedup row and effects, once per job ID, whatever kills and restarts happen; and
`client.result` returns it to a caller waiting meanwhile, or says clearly that it has not
come yet (`ResultTimeout`) or that Postgres does not answer (`DatabaseUnavailable`), and a
caller that asks again gets it. Counted: every job has a `succeeded` row whose value is
what the handler returns for its payload (none lost, none wrong); each job that writes an
effect has exactly one effect row, and one that writes none has none; every waiter got
the job's value, and saw no error other than those two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KeptRow:
    """A row of `stream_jobs_results`."""

    state: str
    value: Any


@dataclass(frozen=True)
class WaitRow:
    """What one waiting client saw: the value it got (`answered`), how many of its waits
    ended in `ResultTimeout` or `DatabaseUnavailable` before it asked again, and any other
    error (a sentence each)."""

    job_id: str
    answered: bool
    value: Any = None
    timeouts: int = 0
    unavailable: int = 0
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResultsEvidence:
    expected: dict[str, Any]  # job ID -> what its handler returns for its payload
    with_effect: frozenset[str]  # the jobs that write an effect row
    kept: dict[str, KeptRow]  # job ID -> its row of kept results
    effects: dict[str, int]  # job ID -> effect rows
    waits: tuple[WaitRow, ...]


@dataclass
class ResultsVerdict:
    jobs: int
    lost: int
    wrong: int
    duplicate_effects: int
    waited: int
    waits_answered: int
    timeouts_retried: int
    unavailable_retried: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _kept_problems(e: ResultsEvidence) -> tuple[int, int, list[str]]:
    lost = [j for j in e.expected if j not in e.kept]
    ended = [j for j in e.expected if j in e.kept and e.kept[j].state != "succeeded"]
    wrong = [j for j in e.expected if j in e.kept and e.kept[j].state == "succeeded"
             and e.kept[j].value != e.expected[j]]
    unknown = [j for j in e.kept if j not in e.expected]
    problems: list[str] = []
    if lost:
        problems.append(f"{len(lost)} jobs have no kept result (e.g. {lost[0]})")
    if ended:
        states = sorted({e.kept[j].state for j in ended})
        problems.append(f"{len(ended)} jobs ended {', '.join(states)} instead of succeeding")
    if wrong:
        j = wrong[0]
        problems.append(f"{len(wrong)} kept results differ from the handler's return value "
                        f"(e.g. {j}: {e.kept[j].value!r}, not {e.expected[j]!r})")
    if unknown:
        problems.append(f"{len(unknown)} kept results belong to no enqueued job")
    return len(lost), len(wrong), problems


def _effect_problems(e: ResultsEvidence) -> tuple[int, list[str]]:
    doubled = sum(n - 1 for j, n in e.effects.items() if n > 1)
    stray = sum(n for j, n in e.effects.items() if j not in e.with_effect)
    missing = [j for j in e.with_effect if j in e.kept and e.effects.get(j, 0) == 0]
    problems: list[str] = []
    if doubled:
        problems.append(f"{doubled} effects happened twice")
    if stray:
        problems.append(f"{stray} effect rows belong to jobs that write none")
    if missing:
        problems.append(f"{len(missing)} jobs have a kept result and no effect: the result "
                        "committed without its effects")
    return doubled, problems


def _wait_problems(e: ResultsEvidence) -> list[str]:
    unanswered = [w.job_id for w in e.waits if not w.answered]
    wrong = [w for w in e.waits if w.answered and w.value != e.expected.get(w.job_id)]
    errors = [f"{w.job_id}: {err}" for w in e.waits for err in w.errors]
    problems: list[str] = []
    if unanswered:
        problems.append(f"{len(unanswered)} waiting clients never got their result "
                        f"(e.g. {unanswered[0]})")
    if wrong:
        w = wrong[0]
        problems.append(f"{len(wrong)} waiting clients got another value than the handler "
                        f"returned (e.g. {w.job_id}: {w.value!r})")
    if errors:
        problems.append(f"{len(errors)} waits ended in an error other than ResultTimeout or "
                        f"DatabaseUnavailable (e.g. {errors[0]})")
    return problems


def judge(evidence: ResultsEvidence) -> ResultsVerdict:
    """What the evidence shows, and every broken promise as a sentence."""
    lost, wrong, problems = _kept_problems(evidence)
    doubled, effect_problems = _effect_problems(evidence)
    problems += effect_problems + _wait_problems(evidence)
    waits = evidence.waits
    return ResultsVerdict(
        len(evidence.expected), lost, wrong, doubled, len(waits),
        sum(1 for w in waits if w.answered), sum(w.timeouts for w in waits),
        sum(w.unavailable for w in waits), problems)


__all__ = ["KeptRow", "ResultsEvidence", "ResultsVerdict", "WaitRow", "judge"]
