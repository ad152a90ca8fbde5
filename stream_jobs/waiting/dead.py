"""A page of a type's dead jobs: one row per job (not per letter), its newest letter's
reason, newest failure first.

The DLQ is counted the way `stream-jobs dlq list` and `stats` count it
(`stream_jobs.dlq.census`): a `DeadJobs` kept across pages (the gateway keeps one for its
lifetime) reads only the letters dead-lettered since its last page; the first page
reads the DLQ once. The cursor is the place of the last job shown, so a job that dies
while someone pages is on the first page, not in the middle.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from stream_jobs.clock import now_ms
from stream_jobs.dlq.census import DlqCensus
from stream_jobs.dlq.listing import dlq_spans
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.settings import Settings
from stream_jobs.waiting.cursor import Cursor, decode, encode
from stream_jobs.waiting.merge import newest_dead
from stream_jobs.waiting.rows import DeadRow


@dataclass(frozen=True)
class DeadPage:
    """One page of dead jobs; `total` is every dead job of the type, `records_read` the
    letters this page read (the new ones, with a kept `DeadJobs`)."""

    job_type: str
    rows: list[DeadRow]
    first: int
    total: int
    size: int
    next_cursor: str | None
    records_read: int
    topic: str
    at_ms: int
    state: str = "dead"
    more_may_follow: bool = False

    def to_dict(self) -> dict[str, object]:
        return {"job_type": self.job_type, "state": "dead", "first": self.first,
                "total": self.total, "size": self.size, "next_cursor": self.next_cursor,
                "records_read": self.records_read, "topics": [self.topic],
                "rows": [row.to_dict() for row in self.rows]}


class DeadJobs:
    """The DLQs of every type read so far, folded into jobs; safe to share between
    concurrent pages."""

    def __init__(self) -> None:
        self._census = DlqCensus()
        self._lock = asyncio.Lock()

    async def page(self, settings: Settings, policy: JobTypePolicy, *,
                   after: str | None = None, size: int = 50) -> DeadPage:
        """One page of `policy`'s dead jobs from the cursor `after` (BadCursor when this
        list did not give it out)."""
        cursor = decode(after, policy.job_type, "dead") if after else Cursor("dead")
        topic = policy.dlq_topic(settings.topic_prefix)
        async with self._lock:
            async with open_reader(settings) as consumer:
                spans = await dlq_spans(consumer, topic)
                before = self._census.counts(topic)
                await self._census.count(consumer, topic, policy.job_type, spans)
            tally = self._census.tally(topic)
            read = tally.letters - (before.letters if before is not None else 0)
            rows = newest_dead(tally.jobs, size + 1, cursor.after)
            total = len(tally.jobs)
        shown, more = rows[:size], len(rows) > size
        next_cursor = encode(Cursor("dead", cursor.shown + len(shown), after=shown[-1].place),
                             policy.job_type) if more else None
        return DeadPage(policy.job_type, shown, cursor.shown + 1, total, size, next_cursor,
                        max(0, read), topic, now_ms())


__all__ = ["DeadJobs", "DeadPage"]
