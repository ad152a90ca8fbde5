"""The issue-26 promise for the lists of waiting jobs: with 100,000 delayed jobs waiting
in one type's delay tier, a page of `/ui/types/T/scheduled` (the first, and a later one
through its cursor) reads a bounded number of records, whatever the backlog, and
answers within a second. The jobs are written as raw records in batches (`send_many`),
as a producer with a backlog would have, not enqueued one by one."""

from __future__ import annotations

import os
import re
import time

import httpx

from stream_jobs.clock import now_ms
from stream_jobs.gateway import create_app
from stream_jobs.job_ids import new_job_id
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from stream_jobs.waiting import READ_CAP_PAGES

from .conftest import Declare

BACKLOG = 100_000
BATCH = 10_000
PARTITIONS = 3
TIERS = ["5s", "10m"]
SIZE = 50
# A page reads at most `size` records a partition, then more only of partitions it used
# up, to READ_CAP_PAGES pages' worth: independent of the backlog.
READ_BOUND = max(READ_CAP_PAGES * SIZE, SIZE * PARTITIONS * len(TIERS)) + SIZE * PARTITIONS
PAGE_WITHIN_S = 1.0


async def _write_backlog(settings: Settings, topic: str, job_type: str) -> list[str]:
    due = now_ms() + 3_600_000
    ids: list[str] = []
    async with JobProducer(settings) as producer:
        for start in range(0, BACKLOG, BATCH):
            batch = [JobRecord(job_id=(job_id := new_job_id()), job_type=job_type,
                               payload=b'{"n":%d}' % n, key=job_id.encode(),
                               enqueued_at_ms=due - 3_600_000, not_before_ms=due + n)
                     for n in range(start, start + BATCH)]
            ids.extend(record.job_id for record in batch)
            await producer.send_many([(topic, record) for record in batch])
    return ids


def _page_facts(html: str) -> tuple[list[str], int, str | None]:
    """The job IDs a page lists, the records it read, and its next page's link."""
    ids = re.findall(r'<tr data-job-id="([^"]+)"', html)
    read = re.search(r'data-records-read="(\d+)"', html)
    nxt = re.search(r'<a href="([^"]+)" data-next>', html)
    assert read is not None, html[:2000]
    return ids, int(read.group(1)), nxt.group(1).replace("&amp;", "&") if nxt else None


async def test_a_page_of_100000_scheduled_jobs_reads_a_page(settings: Settings,
                                                            declare: Declare) -> None:
    policy = await declare("wait.backlog", partitions=PARTITIONS, retry_tiers=TIERS,
                           max_attempts=3)
    started = time.monotonic()
    ids = await _write_backlog(settings, policy.tier_topics(settings.topic_prefix)["10m"],
                               policy.job_type)
    print(f"\nwrote {BACKLOG:,} delayed records in {time.monotonic() - started:.1f} s")
    gateway = create_app(settings, require_token=False, sample=False)
    async with gateway.router.lifespan_context(gateway), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gateway), base_url="http://localhost",
            timeout=30) as http:
        await http.get("/ui/types/wait.backlog/scheduled")  # warm: imports, templates
        url: str | None = "/ui/types/wait.backlog/scheduled"
        seen: list[str] = []
        timings = []
        for number in range(1, 4):
            assert url is not None
            began = time.monotonic()
            answer = await http.get(url)
            took = time.monotonic() - began
            assert answer.status_code == 200, answer.text[:500]
            page_ids, read, url = _page_facts(answer.text)
            timings.append(took)
            print(f"page {number}: {len(page_ids)} rows, {read} records read, "
                  f"{took * 1000:.0f} ms (1-min load {os.getloadavg()[0]:.1f})")
            assert len(page_ids) == SIZE
            assert read <= READ_BOUND, f"page {number} read {read} records"
            assert f"{BACKLOG:,}" in answer.text  # the total: "1-50 of 100,000"
            seen.extend(page_ids)
        # Due first first: the jobs were written in due order within each partition, so the
        # pages are the first jobs due, none twice.
        assert len(set(seen)) == len(seen)
        assert set(seen) <= set(ids[: 3 * SIZE * PARTITIONS])
        assert max(timings) < PAGE_WITHIN_S, f"pages took {timings} s"

        # The retries in the same tier: none among 100,000 delayed jobs. A page stops at
        # its read cap, says more may follow, and its next page goes on from there.
        url = "/ui/types/wait.backlog/retrying"
        for number in range(1, 3):
            assert url is not None
            began = time.monotonic()
            answer = await http.get(url)
            took = time.monotonic() - began
            page_ids, read, url = _page_facts(answer.text)
            print(f"retrying page {number}: {len(page_ids)} rows, {read} records read, "
                  f"{took * 1000:.0f} ms")
            assert page_ids == []
            assert "data-more-may-follow" in answer.text
            assert READ_CAP_PAGES * SIZE <= read <= READ_BOUND
            assert took < PAGE_WITHIN_S
