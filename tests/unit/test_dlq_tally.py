"""How dead letters count (`stream_jobs.dlq.tally`): jobs, letters, repeats, the newest
letter of each job, the rows `dlq list` picks, and the census the gateway keeps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.dlq.census import DlqCensus
from stream_jobs.dlq.letters import Letter
from stream_jobs.dlq.tally import DlqCounts, LatestJobs, LetterTally, job_key
from stream_jobs.failures import FailureInfo
from stream_jobs.kafka.scan import PartitionRange

NOW = 1_700_000_000_000


def _letter(job_id: str, partition: int, offset: int, *, requeues: int = 0,
            failed_at_ms: int = NOW, reason: str = "max-attempts") -> Letter:
    failure = FailureInfo(reason, "RuntimeError", "down", "", failed_at_ms)
    return Letter(partition=partition, offset=offset, timestamp_ms=failed_at_ms + 1,
                  job_id=job_id, failure=failure, attempt=3, requeues=requeues,
                  enqueued_at_ms=NOW - 1000, origin=None, job=None, problem=None)


# A DLQ: letters of a few job IDs ("" is a letter without a readable ID), each at its
# own (partition, offset), with requeues and failure times that need not agree.
_LETTERS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d", ""]), st.integers(0, 3),
              st.integers(0, 3), st.integers(0, 50), st.sampled_from(["x", "y", "z"])),
    max_size=40,
).map(lambda specs: [
    _letter(job, i % 3, i, requeues=requeues, failed_at_ms=NOW + ago, reason=reason)
    for i, (job, requeues, _, ago, reason) in enumerate(specs)])


def _fold(letters: list[Letter]) -> LetterTally:
    tally = LetterTally()
    for letter in letters:
        tally.add(letter)
    return tally


def _newest(letters: list[Letter]) -> dict[str, Letter]:
    best: dict[str, Letter] = {}
    for letter in letters:
        key = job_key(letter)
        held = best.get(key)
        if held is None or (letter.rank, letter.partition) > (held.rank, held.partition):
            best[key] = letter
    return best


@given(_LETTERS, st.randoms())
def test_counts_are_jobs_and_letters_whatever_the_read_order(letters: list[Letter],
                                                             rnd: object) -> None:
    shuffled = list(letters)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    tally, again = _fold(letters), _fold(shuffled)
    counts = tally.counts
    assert counts == again.counts
    assert counts.letters == len(letters)
    assert counts.jobs == len({job_key(letter) for letter in letters}) <= counts.letters
    assert counts.repeats == counts.letters - counts.jobs >= 0
    assert sum(job.letters for job in tally.jobs.values()) == counts.letters
    # The newest letter of each job wins, read in any order.
    newest = _newest(letters)
    for fold in (tally, again):
        assert {k: j.position for k, j in fold.jobs.items()} == {
            k: (n.partition, n.offset) for k, n in newest.items()}
        assert fold.newest() == {(n.partition, n.offset) for n in newest.values()}
        assert fold.reasons() == _histogram(n.reason for n in newest.values())
        assert sum(fold.reasons().values()) == counts.jobs


def _histogram(reasons: object) -> dict[str, int]:
    found: dict[str, int] = {}
    for reason in reasons:  # type: ignore[attr-defined]
        found[reason] = found.get(reason, 0) + 1
    return found


def test_letters_without_a_job_id_are_each_their_own_job() -> None:
    tally = _fold([_letter("", 0, 1), _letter("", 0, 2), _letter("j", 1, 1),
                   _letter("j", 1, 2, requeues=1)])
    assert tally.counts == DlqCounts(letters=4, jobs=3)
    assert tally.counts.to_dict() == {"letters": 4, "jobs": 3, "repeats": 1}


def test_a_killed_worker_s_second_letter_is_a_repeat_and_the_newest() -> None:
    first = _letter("j", 0, 10, failed_at_ms=NOW)
    second = _letter("j", 0, 11, failed_at_ms=NOW + 5)  # the same job, run again
    tally = LetterTally()
    assert tally.add(first)
    assert tally.add(second)
    assert not tally.add(_letter("j", 0, 9, failed_at_ms=NOW - 5))
    assert (tally.counts.jobs, tally.counts.repeats, tally.jobs["j"].position) == (1, 2, (0, 11))


@given(_LETTERS, st.randoms(), st.one_of(st.none(), st.integers(0, 6)))
def test_rows_are_the_newest_letter_of_each_job(letters: list[Letter], rnd: object,
                                                limit: int | None) -> None:
    """Without a limit every job has a row, its newest letter; with one, at most `limit`
    rows, each a job's newest letter, the most recent first when failure times follow
    the ranks (as they do but for clocks that disagree)."""
    rnd.shuffle(letters)  # type: ignore[attr-defined]
    tally = LetterTally()
    picked: LatestJobs[Letter] = LatestJobs(limit)
    for letter in letters:
        picked.offer(letter, tally.add(letter), letter)
    rows = picked.rows()
    newest = _newest(letters)
    assert len({job_key(r) for r in rows}) == len(rows)
    assert all(newest[job_key(r)] == r for r in rows)
    orders = [(r.failed_at_ms, r.partition, r.offset) for r in rows]
    assert orders == sorted(orders)
    if limit is None:
        assert len(rows) == len(newest)
    else:
        assert len(rows) == min(limit, len(newest))


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 1000)), max_size=30),
       st.integers(1, 5))
def test_the_latest_jobs_are_kept_when_failure_times_follow_the_ranks(
        specs: list[tuple[str, int]], limit: int) -> None:
    letters = [_letter(job, 0, i, requeues=i, failed_at_ms=NOW + i) for i, (job, _) in
               enumerate(specs)]
    tally = LetterTally()
    picked: LatestJobs[Letter] = LatestJobs(limit)
    for letter in letters:
        picked.offer(letter, tally.add(letter), letter)
    best = sorted(_newest(letters).values(), key=lambda n: n.failed_at_ms)[-limit:]
    assert picked.rows() == best


def test_every_letter_is_a_row_when_asked() -> None:
    letters = [_letter("j", 0, 1), _letter("j", 0, 2), _letter("k", 0, 3)]
    tally = LetterTally()
    picked: LatestJobs[Letter] = LatestJobs(None, per_letter=True)
    for letter in letters:
        picked.offer(letter, tally.add(letter), letter)
    assert picked.rows() == letters


def test_the_census_reads_only_what_is_new_and_starts_over_after_a_purge() -> None:
    census = DlqCensus()
    spans = [PartitionRange(0, 0, 3), PartitionRange(1, 0, 1)]
    assert census.to_read("t.dlq", spans) == spans
    for letter in (_letter("a", 0, 0), _letter("a", 0, 1), _letter("b", 0, 2),
                   _letter("c", 1, 0)):
        census.tally("t.dlq").add(letter)
    census.read("t.dlq", spans)
    assert census.counts("t.dlq") == DlqCounts(letters=4, jobs=3)

    grown = [PartitionRange(0, 0, 5), PartitionRange(1, 0, 1)]
    todo = census.to_read("t.dlq", grown)
    assert todo == [PartitionRange(0, 3, 5), PartitionRange(1, 1, 1)]
    assert census.counts("t.dlq") is None  # a reading under way is not a count
    census.tally("t.dlq").add(_letter("a", 0, 3))
    census.tally("t.dlq").add(_letter("d", 0, 4))
    census.read("t.dlq", todo)
    assert census.counts("t.dlq") == DlqCounts(letters=6, jobs=4)

    purged = [PartitionRange(0, 5, 6), PartitionRange(1, 1, 1)]
    assert census.to_read("t.dlq", purged) == purged
    assert census.tally("t.dlq").counts == DlqCounts()


def test_a_reading_that_did_not_finish_is_read_again_from_the_start() -> None:
    census = DlqCensus()
    spans = [PartitionRange(0, 0, 2)]
    census.to_read("t.dlq", spans)
    census.tally("t.dlq").add(_letter("a", 0, 0))  # then the broker went away
    assert census.to_read("t.dlq", spans) == spans
    assert census.tally("t.dlq").counts == DlqCounts()
