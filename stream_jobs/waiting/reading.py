"""A page of the jobs waiting in a type's lanes (`pending`) or delay tiers (`scheduled`,
`retrying`), read from Kafka.

Cost: a page reads at most `size` records of each partition from the cursor on (the
first page: from the group's committed offset), then, when some partition's records
are all used up or passed over before the page is full, more of it (twice as many each
time), up to READ_CAP_PAGES pages' worth of records in all. The tiers hold both delayed
enqueues and retries, so a list of one of them may stop there with fewer rows: the page
then says more may follow, and its cursor goes on from where reading stopped. So a page
costs about a page, whatever the backlog: `records_read` says how many it read. The
total is the end offsets less the committed ones, summed (no records are read for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stream_jobs.clock import now_ms
from stream_jobs.errors import BadCursor
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import open_admin
from stream_jobs.kafka.consumer import Consumer, open_reader
from stream_jobs.kafka.scan import PartitionRange, scan
from stream_jobs.naming import TopicRole, relay_group, worker_group
from stream_jobs.settings import Settings
from stream_jobs.waiting.cursor import Cursor, Slot, decode, encode
from stream_jobs.waiting.merge import PageMerge
from stream_jobs.waiting.rows import State, WaitingRow, row_of

READ_CAP_PAGES = 20
# Fetch no more than a page needs: the broker's default (1 MiB a partition) would
# bring thousands of records per fetch for the 50 a page reads.
_FETCH_BYTES = 256 * 1024
# A fetch that finds nothing new answers this soon (the reader never waits for records).
_FETCH_WAIT_MS = 20


@dataclass(frozen=True)
class WaitingPage:
    """One page of a list of waiting jobs. `first` is the number of the page's first row
    (1 on the first page); `total` counts every record waiting where the list looks
    (in the tiers, scheduled and retrying together); `next_cursor` is None when the list
    ended here; `more_may_follow` when the read cap stopped the page before it was full."""

    job_type: str
    state: State
    rows: list[WaitingRow]
    first: int
    total: int
    size: int
    next_cursor: str | None
    more_may_follow: bool
    records_read: int
    topics: tuple[str, ...]
    at_ms: int

    def to_dict(self) -> dict[str, object]:
        return {"job_type": self.job_type, "state": self.state, "first": self.first,
                "total": self.total, "size": self.size, "next_cursor": self.next_cursor,
                "more_may_follow": self.more_may_follow, "records_read": self.records_read,
                "topics": list(self.topics),
                "rows": [row.to_dict(self.at_ms) for row in self.rows]}


@dataclass(frozen=True)
class _Place:
    name: str  # lane or tier
    topic: str
    role: TopicRole


def places_of(prefix: str, policy: JobTypePolicy, state: State) -> tuple[list[_Place], str]:
    """Where the list looks, and the group whose commits mark what left it."""
    if state == "pending":
        lanes = policy.lane_topics(prefix)
        return ([_Place(name, topic, "lane" if name in lanes else "overflow")
                 for name, topic in policy.worker_topics(prefix).items()],
                worker_group(prefix, policy.job_type))
    return ([_Place(tier, topic, "tier") for tier, topic in policy.tier_topics(prefix).items()],
            relay_group(prefix, policy.job_type))


async def waiting_page(settings: Settings, policy: JobTypePolicy, state: State, *,
                       after: str | None = None, size: int = 50) -> WaitingPage:
    """One page of the `state` list (pending, scheduled or retrying) of `policy`'s type,
    from the cursor `after` (a BadCursor when this list did not give it out)."""
    cursor = decode(after, policy.job_type, state) if after else Cursor(state)
    places, group = places_of(settings.topic_prefix, policy, state)
    async with open_reader(settings, max_partition_fetch_bytes=_FETCH_BYTES,
                           fetch_max_wait_ms=_FETCH_WAIT_MS) as consumer:
        starts, ends, topic_of = await _bounds(settings, consumer, places, group)
        unknown = set(cursor.positions) - set(ends)
        if unknown:
            raise BadCursor(f"This page's cursor names partitions the list does not have "
                            f"({sorted(unknown)}): start again from the first page.")
        # Records before the committed offset left the list since the cursor was made.
        positions = {slot: max(start, cursor.positions.get(slot, start))
                     for slot, start in starts.items()}
        merge = PageMerge(state, size, positions, ends)
        read = await _fill(consumer, merge, topic_of, size)
    more = not merge.full and not merge.exhausted
    shown = cursor.shown + len(merge.rows)
    next_cursor = None if merge.exhausted else encode(
        Cursor(state, shown, merge.positions()), policy.job_type)
    return WaitingPage(policy.job_type, state, merge.rows, cursor.shown + 1,
                       sum(ends[slot] - start for slot, start in starts.items()), size,
                       next_cursor, more, read, tuple(place.topic for place in places),
                       now_ms())


async def _fill(consumer: Consumer, merge: PageMerge, topic_of: dict[Slot, _Place],
                size: int) -> int:
    """Read for `merge` until its page is full, every slot is used up, or the cap is
    reached; the records read."""
    cap = max(READ_CAP_PAGES * size, size * len(merge.ends))
    # A partition read again (its rows used up or passed over) is read twice as far each
    # time: few round trips when one list's jobs are rare in a tier.
    chunks = dict.fromkeys(merge.ends, size)
    read = 0
    merge.take()
    while not merge.full and (wanting := merge.wanting()) and read < cap:
        for slot in wanting:
            place, start = topic_of[slot], merge.read_to[slot]
            stop = min(merge.ends[slot], start + max(1, min(chunks[slot], cap - read)))
            chunks[slot] *= 2
            rows: list[WaitingRow] = []
            async for record in scan(consumer, place.topic,
                                     [PartitionRange(slot[1], start, stop)]):
                rows.append(row_of(record, role=place.role, name=place.name))
            read += len(rows)
            merge.feed(slot, rows, stop)
            if read >= cap:
                break
        merge.take()
    return read


async def _bounds(settings: Settings, consumer: Consumer, places: Sequence[_Place], group: str
                  ) -> tuple[dict[Slot, int], dict[Slot, int], dict[Slot, _Place]]:
    """Per slot: where the list starts (the group's committed offset, within what the
    partition holds), its end offset now, and its place."""
    topic_of: dict[Slot, _Place] = {}
    tps: dict[Slot, TopicPartition] = {}
    known = await consumer.learn_topics([place.topic for place in places])
    for place in places:
        for part in sorted(known.get(place.topic, ())):
            topic_of[(place.name, part)] = place
            tps[(place.name, part)] = TopicPartition(place.topic, part)
    wanted = list(tps.values())
    firsts = await consumer.beginning_offsets(wanted) if wanted else {}
    ends = await consumer.end_offsets(wanted) if wanted else {}
    async with open_admin(settings) as admin:
        committed = await admin.committed_offsets(group, wanted)
    starts: dict[Slot, int] = {}
    for slot, tp in tps.items():
        at = committed.get(tp)
        starts[slot] = min(max(at if at is not None else firsts[tp], firsts[tp]), ends[tp])
    return starts, {slot: ends[tp] for slot, tp in tps.items()}, topic_of


__all__ = ["READ_CAP_PAGES", "WaitingPage", "places_of", "waiting_page"]
