"""When a partition's fetching pauses and resumes: by records, and by bytes for large jobs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.kafka import TopicPartition
from stream_jobs.runtime.dispatch import PartitionWork
from stream_jobs.runtime.member import MAX_BUFFERED_BYTES, drained_enough, over_buffer


def _work() -> PartitionWork:
    return PartitionWork(TopicPartition("p.jobs", 0))


def test_many_small_records_pause_by_count() -> None:
    work = _work()
    for offset in range(100):
        work.dispatched(offset, 300)
    assert not over_buffer(work, 101)
    assert over_buffer(work, 100)


def test_a_few_large_records_pause_by_bytes() -> None:
    work = _work()
    size = MAX_BUFFERED_BYTES // 4
    for offset in range(3):
        work.dispatched(offset, size)
    assert not over_buffer(work, 2000)
    work.dispatched(3, size)
    assert over_buffer(work, 2000)  # 4 records, far below 2,000, but 16 MiB of values
    work.finished(0, size)
    assert not drained_enough(work, 2000)  # 12 MiB still held
    work.finished(1, size)
    assert drained_enough(work, 2000)


@given(st.lists(st.integers(min_value=0, max_value=2_000_000), max_size=60),
       st.permutations(range(60)))
def test_finishing_everything_leaves_nothing_buffered(sizes: list[int],
                                                      order: list[int]) -> None:
    work = _work()
    for offset, size in enumerate(sizes):
        work.dispatched(offset, size)
    for offset in (o for o in order if o < len(sizes)):
        work.finished(offset, sizes[offset])
    assert (work.buffered, work.buffered_bytes) == (0, 0)
    assert drained_enough(work, 1)
    assert work.tracker is None or work.tracker.position == len(sizes)
