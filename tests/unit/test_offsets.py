from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from stream_jobs.offsets import OffsetTracker


def test_a_fresh_tracker_commits_where_it_started() -> None:
    tracker = OffsetTracker(100)
    assert tracker.position == 100
    assert tracker.in_flight == 0
    assert not tracker.needs_commit
    assert tracker.committed == 100


def test_position_waits_for_the_lowest_unfinished_offset() -> None:
    tracker = OffsetTracker(0)
    for offset in range(5):
        tracker.dispatched(offset)
    assert tracker.position == 0
    for offset in (4, 3, 1):
        tracker.finished(offset)
        assert tracker.position == 0  # offset 0 still runs: committing past it could lose it
    tracker.finished(0)
    assert tracker.position == 2
    tracker.finished(2)
    assert tracker.position == 5
    assert tracker.in_flight == 0


def test_gaps_from_compaction_and_transaction_markers_are_skipped() -> None:
    tracker = OffsetTracker(10)
    for offset in (10, 13, 20):  # 11, 12, 14..19 never arrive
        tracker.dispatched(offset)
    tracker.finished(10)
    assert tracker.position == 13
    tracker.finished(20)
    assert tracker.position == 13
    tracker.finished(13)
    assert tracker.position == 21


def test_the_first_offset_may_be_past_the_start() -> None:
    tracker = OffsetTracker(0)
    tracker.dispatched(7)  # 0..6 were compacted away
    assert tracker.position == 7
    tracker.finished(7)
    assert tracker.position == 8


def test_needs_commit_follows_the_position_and_mark_committed() -> None:
    tracker = OffsetTracker(0)
    tracker.dispatched(0)
    tracker.dispatched(1)
    assert not tracker.needs_commit  # position is still 0
    tracker.finished(0)
    assert tracker.needs_commit
    taken = tracker.position
    tracker.finished(1)  # finishes while the commit of `taken` is on its way
    tracker.mark_committed(taken)
    assert tracker.committed == 1
    assert tracker.needs_commit
    tracker.mark_committed(tracker.position)
    assert not tracker.needs_commit


@pytest.mark.parametrize("offset", [4, 5, 2])
def test_offsets_must_strictly_increase(offset: int) -> None:
    tracker = OffsetTracker(3)
    tracker.dispatched(5)
    with pytest.raises(ValueError, match="strictly increase"):
        tracker.dispatched(offset)


def test_an_offset_below_the_start_is_refused() -> None:
    tracker = OffsetTracker(3)
    with pytest.raises(ValueError, match="strictly increase"):
        tracker.dispatched(2)


def test_finishing_an_offset_not_in_flight_is_refused() -> None:
    tracker = OffsetTracker(0)
    with pytest.raises(ValueError, match="not in flight"):
        tracker.finished(0)
    tracker.dispatched(0)
    tracker.dispatched(2)
    with pytest.raises(ValueError, match="not in flight"):
        tracker.finished(1)  # a gap, never dispatched
    tracker.finished(2)
    with pytest.raises(ValueError, match="not in flight"):
        tracker.finished(2)  # twice
    assert tracker.in_flight == 1


def test_committing_past_an_unfinished_offset_is_refused() -> None:
    tracker = OffsetTracker(0)
    tracker.dispatched(0)
    tracker.dispatched(1)
    tracker.finished(1)
    with pytest.raises(ValueError, match="past the lowest unfinished"):
        tracker.mark_committed(2)


def test_a_negative_start_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        OffsetTracker(-1)


def test_many_operations_stay_fast() -> None:
    # A quadratic tracker (scanning in-flight offsets per call) would take far longer here.
    rng = random.Random(7)
    tracker = OffsetTracker(0)
    window: list[int] = []
    started = time.perf_counter()
    for offset in range(200_000):
        tracker.dispatched(offset)
        window.append(offset)
        if len(window) >= 1_000:
            tracker.finished(window.pop(rng.randrange(len(window))))
    for offset in window:
        tracker.finished(offset)
    assert tracker.position == 200_000
    assert time.perf_counter() - started < 10


@settings(max_examples=150, deadline=None)
@given(
    start=st.integers(0, 1_000),
    gaps=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    order=st.randoms(use_true_random=False),
)
def test_when_all_finish_the_position_is_one_past_the_last(
    start: int, gaps: list[int], order: random.Random
) -> None:
    tracker = OffsetTracker(start)
    offsets: list[int] = []
    nxt = start
    for gap in gaps:
        nxt += gap
        tracker.dispatched(nxt)
        offsets.append(nxt)
        nxt += 1
    order.shuffle(offsets)
    previous = tracker.position
    for offset in offsets:
        tracker.finished(offset)
        assert tracker.position >= previous
        previous = tracker.position
    assert tracker.position == nxt
    assert tracker.in_flight == 0


class TrackerMachine(RuleBasedStateMachine):
    """The tracker against a plain model: sets of dispatched and unfinished offsets."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = OffsetTracker(0)
        self.start = 0
        self.dispatched: list[int] = []
        self.running: set[int] = set()
        self.finished: set[int] = set()
        self.last_position = 0
        self.committed = 0

    @initialize(start=st.integers(0, 10**12))
    def begin(self, start: int) -> None:
        self.tracker = OffsetTracker(start)
        self.start = self.last_position = self.committed = start

    def next_offset(self) -> int:
        return self.dispatched[-1] + 1 if self.dispatched else self.start

    @rule(gap=st.integers(0, 3) | st.integers(4, 10_000))
    def dispatch(self, gap: int) -> None:
        offset = self.next_offset() + gap
        self.tracker.dispatched(offset)
        self.dispatched.append(offset)
        self.running.add(offset)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(sorted(self.running)))
        self.tracker.finished(offset)
        self.running.remove(offset)
        self.finished.add(offset)

    @rule(data=st.data())
    def finish_an_offset_not_in_flight(self, data: st.DataObject) -> None:
        choices = st.integers(max(0, self.start - 5), self.next_offset() + 5).filter(
            lambda o: o not in self.running
        )
        offset = data.draw(choices)
        with pytest.raises(ValueError, match="not in flight"):
            self.tracker.finished(offset)

    @rule(back=st.integers(1, 5))
    def dispatch_going_backwards(self, back: int) -> None:
        offset = self.next_offset() - back
        with pytest.raises(ValueError, match="strictly increase"):
            self.tracker.dispatched(offset)

    @rule()
    def commit(self) -> None:
        position = self.tracker.position
        self.tracker.mark_committed(position)
        self.committed = position
        assert not self.tracker.needs_commit

    @rule(ahead=st.integers(1, 5))
    def commit_too_far(self, ahead: int) -> None:
        with pytest.raises(ValueError, match="past the lowest unfinished"):
            self.tracker.mark_committed(self.tracker.position + ahead)

    @invariant()
    def position_matches_the_model(self) -> None:
        if self.running:
            expected = min(self.running)
        elif self.dispatched:
            expected = self.dispatched[-1] + 1
        else:
            expected = self.start
        assert self.tracker.position == expected

    @invariant()
    def position_never_passes_an_unfinished_offset(self) -> None:
        assert all(self.tracker.position <= offset for offset in self.running)

    @invariant()
    def position_never_goes_back(self) -> None:
        assert self.tracker.position >= self.last_position
        self.last_position = self.tracker.position

    @invariant()
    def everything_below_the_position_is_finished(self) -> None:
        position = self.tracker.position
        assert all(o in self.finished for o in self.dispatched if o < position)

    @invariant()
    def counts_and_commit_state_agree(self) -> None:
        assert self.tracker.in_flight == len(self.running)
        assert self.tracker.committed == self.committed
        assert self.tracker.needs_commit == (self.tracker.position != self.committed)


TrackerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_tracker_against_a_model = TrackerMachine.TestCase
