"""The lane picker: weighted shares, interleaving, no starvation, lanes coming and going."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.lanes import DEFAULT_LANE_WEIGHTS, LanePicker


def picks(picker: LanePicker, ready: list[list[int]], n: int) -> list[int]:
    out = []
    for _ in range(n):
        lane = picker.pick(ready)
        assert lane is not None
        out.append(lane)
    return out


def test_all_lanes_ready_share_the_default_weights_six_three_one() -> None:
    picker = LanePicker(list(DEFAULT_LANE_WEIGHTS.values()))
    got = Counter(picks(picker, [[1], [1], [1]], 1000))
    assert got == {0: 600, 1: 300, 2: 100}


def test_picks_interleave_rather_than_run_in_blocks() -> None:
    picker = LanePicker([6, 3, 1])
    first = picks(picker, [[1], [1], [1]], 10)
    assert sorted(first) == [0] * 6 + [1] * 3 + [2]
    # Smooth: high never takes more than two starts in a row while others wait.
    longest = run = 1
    for before, lane in itertools.pairwise(first):
        run = run + 1 if lane == before else 1
        longest = max(longest, run)
    assert longest <= 2


def test_an_empty_lane_is_skipped_and_the_others_keep_their_ratio() -> None:
    picker = LanePicker([6, 3, 1])
    got = Counter(picks(picker, [[], [1], [1]], 400))
    assert got == {1: 300, 2: 100}


def test_nothing_ready_is_none() -> None:
    assert LanePicker([6, 3, 1]).pick([[], [], []]) is None


def test_a_lane_back_from_empty_does_not_burst() -> None:
    picker = LanePicker([6, 3, 1])
    picks(picker, [[], [1], [1]], 1000)  # high was empty for a long time
    after = Counter(picks(picker, [[1], [1], [1]], 20))
    assert after[0] <= 13  # its share is 12 of 20; no pent-up credit


@pytest.mark.parametrize("weights", [[], [0, 1], [3, -1]])
def test_weights_are_whole_numbers_of_one_or_more(weights: list[int]) -> None:
    with pytest.raises(ValueError, match="lane weights"):
        LanePicker(weights)


@given(st.lists(st.integers(1, 20), min_size=1, max_size=3),
       st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=300))
def test_only_ready_lanes_are_picked_and_credit_stays_bounded(
        weights: list[int], readiness: list[list[bool]]) -> None:
    picker = LanePicker(weights)
    total = sum(weights)
    for ready in readiness:
        queues = [[1] if r else [] for r in ready[:len(weights)]]
        lane = picker.pick(queues)
        if not any(queues):
            assert lane is None
        else:
            assert lane is not None
            assert queues[lane]
        assert sum(picker._credit) == 0
        assert all(abs(c) <= len(weights) * total for c in picker._credit)


@given(st.lists(st.integers(1, 12), min_size=2, max_size=3), st.integers(1, 5))
def test_every_window_of_sum_weights_picks_gives_each_lane_its_weight(
        weights: list[int], rounds: int) -> None:
    picker = LanePicker(weights)
    total = sum(weights)
    seq = picks(picker, [[1]] * len(weights), total * rounds)
    for start in range(0, len(seq), total):
        window = Counter(seq[start:start + total])
        assert [window[i] for i in range(len(weights))] == weights
