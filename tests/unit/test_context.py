"""JobContext: the job's identity, read from the decoded record, and read-only."""

from __future__ import annotations

from typing import Any, cast

import pytest

from stream_jobs.context import JobContext
from stream_jobs.dedup.store import DedupStore
from stream_jobs.record import JobRecord


def _context(**fields: Any) -> JobContext:
    job = JobRecord(**{"job_id": "j-1", "job_type": "email.send", "payload": b"{}",
                       "key": b"user-7", **fields})
    return JobContext(job, topic="jobs.email.send", partition=3, offset=41,
                      dedup=cast(DedupStore, None))


def test_reads_the_jobs_fields_and_where_it_was_read() -> None:
    ctx = _context(attempt=2, enqueued_at_ms=1_700_000_000_123, lane="high")
    assert (ctx.job_id, ctx.job_type, ctx.attempt, ctx.key, ctx.lane) == (
        "j-1", "email.send", 2, "user-7", "high")
    assert ctx.enqueued_at_ms == 1_700_000_000_123
    assert ctx.enqueued_at.timestamp() == pytest.approx(1_700_000_000.123)
    assert (ctx.topic, ctx.partition, ctx.offset) == ("jobs.email.send", 3, 41)
    assert "j-1" in repr(ctx)
    assert "offset=41" in repr(ctx)


def test_a_key_that_is_not_utf8_is_replaced_not_an_error() -> None:
    assert _context(key=b"k\xff").key == "k\ufffd"
    assert _context(key=None).key is None


@pytest.mark.parametrize("name", ["job_id", "job_type", "attempt", "key", "enqueued_at_ms",
                                  "lane", "topic", "partition", "offset", "something_new"])
def test_a_handler_cannot_change_it(name: str) -> None:
    ctx = _context()
    with pytest.raises(AttributeError):
        setattr(ctx, name, "changed")
