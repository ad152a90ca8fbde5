"""The outbox's pure rules: which claimed rows a relay may send (the ordering rule, against
a model of relays sharing rows with SKIP LOCKED), child job IDs, headers, statements."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.job_ids import job_id_time_ms, new_job_id
from stream_jobs.outbox.rows import (
    OutboxRow,
    channel,
    child_job_id,
    decode_headers,
    encode_headers,
    insert_sql,
    retry_delay_s,
    sendable,
)
from stream_jobs.record import JobRecord


def row(id_: int, key: str, topic: str = "t") -> OutboxRow:
    return OutboxRow(id_, topic, key.encode(), b"{}")


def test_a_row_waits_behind_an_earlier_row_of_its_key_held_elsewhere() -> None:
    claimed = [row(5, "a"), row(6, "b"), row(7, "a"), row(8, "a", topic="u")]
    now, held = sendable(claimed, {("t", b"a"): 3})
    assert [r.id for r in now] == [6, 8]  # another key; the same key in another topic
    assert [r.id for r in held] == [5, 7]
    assert sendable(claimed, {}) == (claimed, [])


@dataclass
class Relay:
    claimed: list[OutboxRow] = field(default_factory=list)
    to_send: list[OutboxRow] = field(default_factory=list)
    sent: bool = False


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.sampled_from("abc"), min_size=1, max_size=40),
       batch=st.integers(1, 6), relays=st.integers(1, 4), data=st.data())
def test_rows_of_a_key_reach_the_partition_in_id_order_whatever_the_interleaving(
        keys: list[str], batch: int, relays: int, data: st.DataObject) -> None:
    """A model of the table: relays claim (the `batch` smallest unlocked ids, as
    `ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`), look for earlier rows of their keys
    that they do not hold, send what `sendable` lets them (appended to the partition,
    the ack), and commit (sent rows deleted, the rest unlocked), in any interleaving."""
    table = {i + 1: row(i + 1, k) for i, k in enumerate(keys)}
    locked: set[int] = set()
    partition: list[OutboxRow] = []
    workers = [Relay() for _ in range(relays)]

    def step(n: int) -> None:
        relay = workers[n]
        if not relay.claimed:  # claim
            free = sorted(i for i in table if i not in locked)[:batch]
            if not free:
                return
            relay.claimed = [table[i] for i in free]
            locked.update(free)
            top = free[-1]
            earlier: dict[tuple[str, bytes | None], int] = {}
            for i, other in table.items():
                if i < top and i not in free:
                    slot = (other.topic, other.key)
                    earlier[slot] = min(earlier.get(slot, i), i)
            relay.to_send, _ = sendable(relay.claimed, earlier)
        elif not relay.sent:  # produce and get the ack
            partition.extend(relay.to_send)
            relay.sent = True
        else:  # commit: delete what was sent, unlock the rest
            for r in relay.claimed:
                locked.discard(r.id)
            for r in relay.to_send:
                del table[r.id]
            workers[n] = Relay()

    # Any interleaving first; then every relay in turn: a scheduler that starves the relay
    # holding the rows (drawing an idle one every time) proves nothing about the rule.
    for _ in range(40 * len(keys)):
        if not table:
            break
        step(data.draw(st.integers(0, relays - 1)))
    for _ in range(4 * len(keys) + 4):
        for n in range(relays):
            step(n)
    assert not table, "rows left behind: the rule must never hold every relay back"
    for key in set(keys):
        ids = [r.id for r in partition if r.key == key.encode()]
        assert ids == sorted(ids), f"key {key}: {ids}"


def test_child_ids_are_derived_from_the_parent() -> None:
    parent = new_job_id()
    first = child_job_id(parent, "0")
    assert first == child_job_id(parent, "0")
    assert len({first, child_job_id(parent, "1"), child_job_id(new_job_id(), "0")}) == 3
    # A UUIDv7 parent's children are UUIDv7s of its millisecond: they sort beside it.
    assert job_id_time_ms(first) == job_id_time_ms(parent)
    other = child_job_id("order-42", "receipt")
    assert len(other) == 36
    assert other[14] == "8"  # a UUIDv8 for a parent ID of the caller's own
    assert other[19] in "89ab"


def test_headers_round_trip_and_must_be_text() -> None:
    record = JobRecord(job_id="j", job_type="t.x", payload=b"{}", key=b"k",
                       not_before_ms=5, traceparent="00-ab-cd-01")
    stored = encode_headers(record.headers())
    assert decode_headers(stored) == tuple(record.headers())
    with pytest.raises(ValueError, match="UTF-8"):
        encode_headers([("h", b"\xff")])


def test_statements_and_channels() -> None:
    assert "$5" in insert_sql("s", "asyncpg")
    assert insert_sql("s", "format").count("%s") == 5
    assert ":channel" in insert_sql("s", "named")
    assert '"s".stream_jobs_outbox' in insert_sql("s", "format")
    assert channel("public") == "stream_jobs_outbox.public"
    long = channel("x" * 80)
    assert len(long) <= 63
    assert long != channel("x" * 81)
    assert [retry_delay_s(n) for n in (1, 2, 3, 4, 5, 9)] == [0.5, 1, 2, 4, 5, 5]
