"""The history's guard on faust's read offsets (stream_jobs/history/stream.py): a record
handed while the consumer's flow is suspended must come again after the seek, not be
dropped as read. Found by the history chaos trial (docs/history.md, Limits)."""

from __future__ import annotations

from dataclasses import dataclass

from stream_jobs.history.stream import History, ReadOffsets
from stream_jobs.kafka import TopicPartition
from stream_jobs.naming import history_topic, stats_topic
from stream_jobs.settings import Settings

STATS = TopicPartition("p._stats", 0)
WINDOWS = TopicPartition("p._history.windows", 0)
CHANGELOG = TopicPartition("p._history-totals-changelog", 0)


@dataclass
class Flow:
    flow_active: bool = True


def test_no_report_is_ever_dropped_as_already_read() -> None:
    # The trial's loss: reports handed before the tables were restored were never
    # folded, and came again after the seek below faust's read offset.
    offsets = ReadOffsets(Flow(), rereadable={STATS.topic}, held={WINDOWS.topic})
    offsets[STATS] = 258
    offsets.update({STATS: 225})
    offsets[STATS] = 300
    assert offsets[STATS] is None  # so 225, 226, ... pass faust's test, read again


def test_a_window_handed_while_paused_does_not_move_the_read_offset() -> None:
    flow = Flow()
    offsets = ReadOffsets(flow, rereadable={STATS.topic}, held={WINDOWS.topic})
    assert offsets[WINDOWS] is None
    offsets[WINDOWS] = 10  # read while flowing
    flow.flow_active = False  # a rebalance: records handed now are dropped unread
    offsets[WINDOWS] = 11
    offsets[WINDOWS] = 12
    assert offsets[WINDOWS] == 10
    offsets.update({WINDOWS: 5})  # the seek to the committed offset
    flow.flow_active = True
    assert offsets[WINDOWS] == 5  # so 5, 6, ... 12 are read again, in order
    offsets[WINDOWS] = 6
    assert offsets[WINDOWS] == 6


def test_a_seek_back_while_paused_still_applies_and_other_topics_are_faust_s_own() -> None:
    flow = Flow(flow_active=False)
    offsets = ReadOffsets(flow, rereadable={STATS.topic}, held={WINDOWS.topic})
    offsets.update({WINDOWS: 20})
    offsets[WINDOWS] = 7  # backwards: a seek by item
    assert offsets[WINDOWS] == 7
    offsets[CHANGELOG] = 99  # recovery seeks changelogs forward while paused
    assert offsets[CHANGELOG] == 99


def test_the_history_app_runs_with_the_guard(tmp_path: object) -> None:
    settings = Settings(topic_prefix="p", history_data_dir=str(tmp_path))
    history = History(settings)
    guard = history.app.consumer._read_offset
    assert isinstance(guard, ReadOffsets)
    assert stats_topic("p") in guard._rereadable
    assert history_topic("p") in guard._held
