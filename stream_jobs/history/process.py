"""Running the history app: `stream-jobs history`, or inside `stream-jobs serve
--history` for a single box.

The app runs on the caller's event loop until `stop` is set (SIGTERM, Ctrl-C) or it
crashes; a crash is raised as `HistoryStopped` so the command exits non-zero and its
supervisor (systemd, Kubernetes, `dev up`) starts it again, which is safe at any point:
its tables come back from their changelogs and its transactions make each report count
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from stream_jobs.errors import StreamJobsError
from stream_jobs.history.stream import History
from stream_jobs.kafka.admin import admin_client, ensure_internal_topic
from stream_jobs.naming import STATS_TOPIC_CONFIG, history_topic, stats_topic
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.history")

# P._history.windows holds each window's latest tally (compacted), a week past its end.
WINDOWS_TOPIC_CONFIG = {"cleanup.policy": "compact,delete", "retention.ms": str(7 * 86_400_000),
                        "min.compaction.lag.ms": "60000"}


class HistoryStopped(StreamJobsError):
    """The history app crashed (its reason is in the message and the log above it)."""


async def prepare(settings: Settings) -> int:
    """Make the topics the app reads and writes; the replication its own topics get (as
    many brokers as there are, up to 3)."""
    await ensure_internal_topic(settings, stats_topic(settings.topic_prefix),
                                STATS_TOPIC_CONFIG)
    await ensure_internal_topic(settings, history_topic(settings.topic_prefix),
                                WINDOWS_TOPIC_CONFIG)
    async with admin_client(settings) as admin:
        brokers = len((await admin.describe_cluster())["brokers"])
    return min(3, max(1, brokers))


async def run_history(settings: Settings, stop: asyncio.Event) -> History:
    """Run the history app until `stop` is set; `HistoryStopped` if it crashed."""
    history = History(settings, replication=await prepare(settings))
    app = history.app
    await app.start()
    log.info("history of prefix %s: reading %s", settings.topic_prefix, history.reports.topics)
    try:
        ended = asyncio.ensure_future(app.wait_until_stopped())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for task in (ended, stopping):
            task.cancel()
    finally:
        crashed, reason = app.crashed, app.crash_reason
        with contextlib.suppress(Exception):
            await app.stop()
        await history.store.close()
    if crashed:
        raise HistoryStopped(f"the history app stopped on an error: {reason!r}")
    return history


__all__ = ["WINDOWS_TOPIC_CONFIG", "HistoryStopped", "prepare", "run_history"]
