"""The fairness trial's plan and verdict (ops/chaos/fairness.py, fair_verdict.py): the
waves move tenants in and out of a flood over shared keys, and each broken promise is
named while a clean run has none."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import replace

from ops.chaos.fair_verdict import EffectRow, FairEvidence, Planned, judge, out_of_order
from ops.chaos.fairness import TRIAL, FairTrialResult, fair_row, plan


def test_the_plan_alternates_the_noisy_tenant_and_numbers_each_key_in_order() -> None:
    waves = plan(1_000, 4, random.Random(7))
    assert [len(w) for w in waves] == [250, 250, 250, 250]
    floods = [max({p.tenant for p in w}, key=[p.tenant for p in w].count) for w in waves]
    assert floods == ["n0", "n1", "n0", "n1"]
    assert sum(p.tenant.startswith("n") for p in waves[0]) == 200
    seqs: dict[str, list[int]] = defaultdict(list)
    tenants: dict[str, set[str]] = defaultdict(set)
    for p in (p for w in waves for p in w):
        seqs[p.key].append(p.seq)
        tenants[p.key].add(p.tenant)
    assert all(own == list(range(1, len(own) + 1)) for own in seqs.values())
    assert any(len(names) > 2 for key, names in tenants.items() if key.startswith("s"))
    assert sum(len(w) for w in plan(1_001, 4, random.Random(1))) == 1_001


def _clean() -> FairEvidence:
    enqueued = {f"j{i}": Planned("n0" if i % 2 else "q0", f"k{i % 3}", i // 3 + 1)
                for i in range(9)}
    effects = tuple(EffectRow(job_id, p.key, p.seq, 100.0 + int(job_id[1:]))
                    for job_id, p in enqueued.items())
    return FairEvidence(enqueued, effects, overflowed=5)


def test_a_clean_run_breaks_no_promise() -> None:
    verdict = judge(_clean())
    assert verdict.ok, verdict.problems
    assert (verdict.lost, verdict.duplicate_effects, verdict.keys_out_of_order) == (0, 0, 0)


def test_lost_doubled_and_stranger_effects_are_named() -> None:
    clean = _clean()
    effects = (*clean.effects[1:], clean.effects[2], EffectRow("x", "k0", 9, 200.0))
    verdict = judge(replace(clean, effects=effects))
    assert (verdict.lost, verdict.duplicate_effects) == (1, 1)
    text = " | ".join(verdict.problems)
    assert "1 jobs have no effect, e.g. ['j0']" in text
    assert "1 jobs had their effect more than once" in text
    assert "effects of job IDs never enqueued, e.g. ['x']" in text


def test_a_key_whose_effects_go_back_in_sequence_is_named() -> None:
    clean = _clean()
    # j3 (k0, seq 2) takes effect after j6 (k0, seq 3); a later duplicate changes nothing.
    moved = tuple(replace(e, at=110.0) if e.job_id == "j3" else e for e in clean.effects)
    assert out_of_order(moved) == {"k0": [1, 3, 2]}
    verdict = judge(replace(clean, effects=moved))
    assert verdict.keys_out_of_order == 1
    assert "key k0: effects in the order 1, 3, 2" in verdict.problems
    again = (*clean.effects, replace(clean.effects[3], at=300.0))
    assert out_of_order(again) == {}


def test_a_run_with_nothing_through_the_overflow_proved_nothing() -> None:
    verdict = judge(replace(_clean(), overflowed=0))
    assert verdict.problems == ["no job went through the overflow lane: the run proved "
                                "nothing about it"]


def test_the_chaos_report_has_a_line_per_fairness_run() -> None:
    from ops.chaos.protocol import section

    started = time.time() - 61.0
    lines = section(TRIAL, [fair_row(FairTrialResult(3, 8, 61.0, judge(_clean())), 1,
                                     started)])
    assert lines[0] == "## Fair queues"
    assert "**Verdict: every run passed its checks (1 of 1).**" in lines
    assert "| 1 | 9 | 3 | 8 | 0 | 0 | 0 | 0 | 0 | 5 | 61 | yes |" in lines


def test_a_retried_job_may_take_effect_after_later_jobs_of_its_key() -> None:
    # Postgres restarting: seq 1 fails, leaves for a delay tier and runs after seq 2.
    # Ordering is promised for jobs that succeed first time (docs/design), so this is no
    # problem, and the retry is counted.
    planned = {"a": Planned("t", "k", 1), "b": Planned("t", "k", 2),
               "c": Planned("t", "k", 3)}
    effects = (EffectRow("b", "k", 2, 1.0), EffectRow("a", "k", 1, 2.0, attempt=2),
               EffectRow("c", "k", 3, 3.0))
    verdict = judge(FairEvidence(planned, effects, 1))
    assert verdict.ok, verdict.problems
    assert verdict.retried == 1
    assert out_of_order(effects) == {}


def test_first_attempts_out_of_order_are_still_found_beside_retries() -> None:
    planned = {"a": Planned("t", "k", 1), "b": Planned("t", "k", 2),
               "c": Planned("t", "k", 3)}
    effects = (EffectRow("c", "k", 3, 1.0), EffectRow("b", "k", 2, 2.0),
               EffectRow("a", "k", 1, 3.0, attempt=2))
    assert out_of_order(effects) == {"k": [3, 2]}
    assert not judge(FairEvidence(planned, effects, 1)).ok


def test_a_job_sent_to_a_delay_tier_is_out_of_the_order_check_whatever_its_row_says() -> None:
    # Seen in a fairness run with a Postgres restart: seq 1's first attempt failed and
    # went to the delay tier, the worker was killed before its commit, and the first-
    # attempt record, read again, took effect after seq 2: its row says attempt 1.
    planned = {"a": Planned("t", "k", 1), "b": Planned("t", "k", 2)}
    effects = (EffectRow("b", "k", 2, 1.0), EffectRow("a", "k", 1, 2.0))
    assert not judge(FairEvidence(planned, effects, 1)).ok
    verdict = judge(FairEvidence(planned, effects, 1, delayed=frozenset({"a"})))
    assert verdict.ok, verdict.problems
    assert verdict.retried == 1
