"""The supervisor's idle agreement over its children (`--processes N --until-idle`). Pure.

The property at the end plays random interleavings of children going busy and quiet,
answering questions late, and messages arriving whenever, and checks the one thing that
makes stopping safe: when the supervisor agrees, there was an instant (its question)
inside every child's quiet spell.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from hypothesis import event, given, settings
from hypothesis import strategies as st

from stream_jobs.runtime.agreement import (
    BUSY,
    IDLE,
    Agreed,
    Ask,
    IdleAgreement,
    confirm,
    confirm_round,
    still,
)


def running(*children: int) -> IdleAgreement:
    agreement = IdleAgreement(frozenset(children))
    for child in children:
        agreement.started(child)
    return agreement


def test_every_child_idle_starts_a_round_and_every_answer_agrees() -> None:
    a = running(1, 2)
    assert a.heard(1, IDLE) is None  # child 2 has not said it yet
    assert a.heard(2, IDLE) == Ask(1, (1, 2))
    assert a.heard(1, still(1)) is None
    assert a.heard(2, still(1)) == Agreed()


def test_a_busy_child_calls_the_round_off_and_late_answers_are_ignored() -> None:
    a = running(1, 2)
    a.heard(1, IDLE)
    assert a.heard(2, IDLE) == Ask(1, (1, 2))
    assert a.heard(1, still(1)) is None
    assert a.heard(2, BUSY) is None  # a job came in: round 1 is off
    assert a.heard(2, still(1)) is None  # answered before it said busy: not counted
    assert a.heard(2, IDLE) == Ask(2, (1, 2))
    assert a.heard(1, still(1)) is None  # an answer to the old round
    assert a.heard(1, still(2)) is None
    assert a.heard(2, still(2)) == Agreed()


def test_a_child_that_ends_or_restarts_must_say_idle_again() -> None:
    a = running(1, 2)
    a.heard(1, IDLE)
    a.heard(2, IDLE)
    a.ended(2)  # its partitions go to the others: the round is off
    assert a.heard(1, still(1)) is None
    assert a.heard(2, still(1)) is None  # not running: not heard
    assert a.heard(1, IDLE) is None  # idle, but child 2 is not running
    a.started(2)
    assert a.heard(1, still(1)) is None
    assert a.heard(2, IDLE) == Ask(2, (1, 2))
    a.heard(1, still(2))
    assert a.heard(2, still(2)) == Agreed()


def test_nothing_is_asked_until_every_child_runs() -> None:
    a = IdleAgreement(frozenset({1, 2}))
    a.started(1)
    assert a.heard(1, IDLE) is None
    assert a.heard(1, b"nonsense") is None
    assert a.heard(1, b"still x") is None


def test_questions_are_read_back() -> None:
    assert confirm_round(confirm(12)) == 12
    assert confirm_round(still(12)) is None
    assert confirm_round(b"confirm ") is None


# -- the property -----------------------------------------------------------------------------


@dataclass
class SimChild:
    """A child as the supervisor cannot see it: its quiet spell and its two queues."""

    quiet_since: float | None = None  # start of the current quiet spell (None: busy)
    to_supervisor: deque[tuple[bytes, tuple[float, float] | None]] = field(
        default_factory=deque)
    questions: deque[int] = field(default_factory=deque)


CHILDREN = (1, 2, 3)
# Weighted so that some scripts reach an agreement, a few of them more than once.
ACTIONS = ["busy"] * 2 + ["quiet"] * 6 + ["answer"] * 6 + ["deliver"] * 10 + ["restart"]


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(60, 300))
def test_an_agreement_always_has_an_instant_inside_every_quiet_spell(
        rng: random.Random, length: int) -> None:
    script = [(rng.choice(ACTIONS), rng.choice(CHILDREN)) for _ in range(length)]
    agreement = running(*CHILDREN)
    children = {c: SimChild() for c in CHILDREN}
    asked_at: dict[int, float] = {}
    # Each child's answer of each round: when its quiet spell began, when it answered.
    answered: dict[tuple[int, int], tuple[float, float]] = {}
    agreed = 0
    for now, (action, c) in enumerate(script):
        child = children[c]
        if action == "busy" and child.quiet_since is not None:
            child.quiet_since = None
            child.to_supervisor.append((BUSY, None))
        elif action == "quiet" and child.quiet_since is None:
            child.quiet_since = now
            child.to_supervisor.append((IDLE, None))
        elif action == "answer" and child.questions and child.quiet_since is not None:
            # A check after the question, nothing come in since the spell began.
            child.to_supervisor.append((still(child.questions.popleft()),
                                        (child.quiet_since, now)))
        elif action == "restart":
            agreement.ended(c)
            children[c] = SimChild()  # a new process: busy until its first check
            agreement.started(c)
        elif action == "deliver" and child.to_supervisor:
            message, spell = child.to_supervisor.popleft()
            decision = agreement.heard(c, message)
            if spell is not None:
                answered[(c, int(message.split()[1]))] = spell
            if isinstance(decision, Ask):
                asked_at[decision.round_no] = now
                for other in decision.children:
                    children[other].questions.append(decision.round_no)
            elif isinstance(decision, Agreed):
                agreed += 1
                round_no = agreement.round_no
                for other in CHILDREN:
                    assert (other, round_no) in answered, f"child {other} never answered"
                    began, answered_at = answered[(other, round_no)]
                    assert began < asked_at[round_no] < answered_at
    event(f"agreed {min(agreed, 2)} times")
