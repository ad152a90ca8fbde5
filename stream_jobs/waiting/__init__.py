"""Jobs by state, per type, paged: the jobs waiting in a type's lanes (`pending`), its
delayed enqueues and retries waiting in its delay tiers (`scheduled`, `retrying`), and
its dead jobs (`dead`). What the dashboard's tabs and `stream-jobs waiting` show.

Inside, top to bottom: `reading` (the lanes and tiers read from Kafka) and `dead` (the
DLQ, counted as `stream_jobs.dlq` counts it), then `merge` (the page order and where the
next page starts), then the pure `rows` (which list a record belongs to) and `cursor`
(the opaque, checked cursor). A page costs a page, not the backlog (`reading`).
"""

from __future__ import annotations

from stream_jobs.waiting.cursor import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, page_size
from stream_jobs.waiting.dead import DeadJobs, DeadPage
from stream_jobs.waiting.reading import READ_CAP_PAGES, WaitingPage, waiting_page
from stream_jobs.waiting.rows import STATES, DeadRow, State, WaitingRow, state_named

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "READ_CAP_PAGES", "STATES", "DeadJobs",
           "DeadPage", "DeadRow", "State", "WaitingPage", "WaitingRow", "page_size",
           "state_named", "waiting_page"]
