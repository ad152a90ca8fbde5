"""The pure half of the lists of waiting jobs (`stream_jobs.waiting`): the cursor's round
trip and its refusals, the page size, and the merge that orders a page and says where
the next one starts."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.dlq.tally import JobLetters
from stream_jobs.errors import BadCursor, ConfigError
from stream_jobs.failures import FailureInfo
from stream_jobs.waiting.cursor import Cursor, Slot, decode, encode, page_size
from stream_jobs.waiting.merge import PageMerge, newest_dead
from stream_jobs.waiting.rows import State, WaitingRow

names = st.sampled_from(["default", "high", "low", "5s", "1m", "10m", "1.5h"])
counts = st.integers(min_value=0, max_value=2**53)
cursors = st.builds(
    Cursor, state=st.sampled_from(["pending", "scheduled", "retrying", "dead"]), shown=counts,
    positions=st.dictionaries(st.tuples(names, st.integers(0, 4096)), counts, max_size=40),
    after=st.none() | st.tuples(counts, st.integers(0, 4096), counts))


@given(cursors, st.text(min_size=1, max_size=40))
def test_a_cursor_comes_back_as_it_went(cursor: Cursor, job_type: str) -> None:
    text = encode(cursor, job_type)
    assert text.replace("-", "").replace("_", "").replace(".", "").isalnum()  # URL-safe
    assert decode(text, job_type, cursor.state) == cursor


@given(cursors, st.data())
def test_a_changed_cursor_is_refused(cursor: Cursor, data: st.DataObject) -> None:
    text = encode(cursor, "email.send")
    at = data.draw(st.integers(0, len(text) - 1))
    other = data.draw(st.sampled_from("AbZ09-_.=").filter(lambda c: c != text[at]))
    with pytest.raises(BadCursor, match="first page"):
        decode(text[:at] + other + text[at + 1:], "email.send", cursor.state)


@given(cursors)
def test_a_cursor_belongs_to_its_list(cursor: Cursor) -> None:
    text = encode(cursor, "email.send")
    with pytest.raises(BadCursor):
        decode(text, "email.other", cursor.state)
    with pytest.raises(BadCursor):
        decode(text, "email.send", "pending" if cursor.state != "pending" else "dead")
    with pytest.raises(BadCursor):
        decode(text[: len(text) // 2], "email.send", cursor.state)


@pytest.mark.parametrize("text", ["", ".", "abc", "a.b.c", "%%%.%%%", "x" * 20_000,
                                  "bm90IGpzb24.AAAAAAAAAAA"])
def test_garbage_is_a_bad_cursor(text: str) -> None:
    with pytest.raises(BadCursor):
        decode(text, "email.send", "pending")


def test_page_sizes() -> None:
    assert page_size(None) == 50
    assert page_size("") == 50
    assert page_size("500") == 500
    for bad in ("0", "501", "-1", "ten", "1e3"):
        with pytest.raises(ConfigError, match="1 to 500"):
            page_size(bad)


# -- the merge ---------------------------------------------------------------------------

_FAILED = FailureInfo(reason="error", error_class="ValueError", message="no", traceback="",
                      failed_at_ms=1)


def _row(slot: Slot, offset: int, due: int, retry: bool) -> WaitingRow:
    return WaitingRow(job_id=f"{slot[0]}-{slot[1]}-{offset}",
                      state="retrying" if retry else "scheduled", place=slot[0],
                      partition=slot[1], offset=offset, attempt=2 if retry else 1,
                      timestamp_ms=0, enqueued_at_ms=None, due_ms=due,
                      failure=_FAILED if retry else None)


# Per slot: its records in offset order, as (due time, is a retry).
partitions = st.dictionaries(
    st.tuples(st.sampled_from(["5s", "1m"]), st.integers(0, 3)),
    st.lists(st.tuples(st.integers(0, 1000), st.booleans()), max_size=30), min_size=1,
    max_size=6)


def _page(records: Mapping[Slot, list[WaitingRow]], state: State, size: int,
          positions: Mapping[Slot, int], chunk: int) -> PageMerge:
    """A page as `waiting_page` reads it, from memory, `chunk` records at a time."""
    merge = PageMerge(state, size, positions, {slot: len(rows) for slot, rows in records.items()})
    merge.take()
    while not merge.full and (wanting := merge.wanting()):
        for slot in wanting:
            start = merge.read_to[slot]
            stop = min(len(records[slot]), start + chunk)
            merge.feed(slot, records[slot][start:stop], stop)
        merge.take()
    return merge


@given(partitions, st.sampled_from(["scheduled", "retrying"]), st.integers(1, 12),
       st.integers(1, 12))
def test_pages_list_every_job_once_in_due_order(layout: dict[Slot, list[tuple[int, bool]]],
                                                state: State, size: int, chunk: int) -> None:
    # Each partition is due in order (as one tier's partition mostly is): the pages are
    # then in due order across partitions, and paging loses and repeats nothing.
    records = {slot: [_row(slot, offset, due, retry)
                      for offset, (due, retry) in enumerate(sorted(items))]
               for slot, items in layout.items()}
    positions = {slot: 0 for slot in records}
    listed: list[WaitingRow] = []
    for _ in range(1000):
        merge = _page(records, state, size, positions, chunk)
        assert len(merge.rows) == size or merge.exhausted
        listed.extend(merge.rows)
        if merge.exhausted:
            break
        positions = merge.positions()
    wanted = sorted((row for rows in records.values() for row in rows if row.state == state),
                    key=lambda row: row.order)
    assert [row.job_id for row in listed] == [row.job_id for row in wanted]


@given(partitions, st.integers(1, 12))
def test_a_page_takes_a_run_of_each_partition(layout: dict[Slot, list[tuple[int, bool]]],
                                              size: int) -> None:
    # Whatever the order in a partition, a page takes a run from each partition's cursor:
    # the next cursor is after the last row used, and every row before it was used.
    records = {slot: [_row(slot, offset, due, retry)
                      for offset, (due, retry) in enumerate(items)]
               for slot, items in layout.items()}
    merge = _page(records, "scheduled", size, {slot: 0 for slot in records}, size)
    after = merge.positions()
    for slot, rows in records.items():
        taken = [row for row in merge.rows if (row.place, row.partition) == slot]
        before = [row for row in rows[: after[slot]] if row.state == "scheduled"]
        assert taken == before


def test_the_dead_newest_first_after_the_last_shown() -> None:
    jobs = {f"job-{n}": JobLetters(1, (0, 1000 + n, 1000 + n, n), (n % 2, n), "error")
            for n in range(7)}
    jobs["\0" + "1/99"] = JobLetters(1, (0, 500, 500, 99), (1, 99), "undecodable")
    first = newest_dead(jobs, 3, None)
    assert [row.job_id for row in first] == ["job-6", "job-5", "job-4"]
    second = newest_dead(jobs, 3, first[-1].place)
    assert [row.job_id for row in second] == ["job-3", "job-2", "job-1"]
    last = newest_dead(jobs, 3, second[-1].place)
    assert [(row.job_id, row.reason) for row in last] == [("job-0", "error"),
                                                         ("", "undecodable")]
