"""The history process: a faust-streaming app that folds the workers' reports into
windows, exactly once.

It reads `P._stats` (every worker's report: its slots, see `windows.SlotTallies`) and
keeps, in faust tables whose changelogs are Kafka topics:

- `last-seen`: per worker, the slots its previous report said, so each report adds only
  what is new (`slot_deltas`);
- `minutes` and `hours`: per type, a tally per tumbling window (a minute, kept 7 days; an
  hour, kept 90 days);
- `totals`: per type, the running total since history began.

It runs with `processing_guarantee="exactly_once"`: a report's table updates, the window
tallies it sends to `P._history.windows` and the report's offset commit are one Kafka
transaction, so a process killed at any point and started again counts each report once.
A second agent reads `P._history.windows` (read committed: only what a transaction
committed) and sets those rows of `stream_jobs_history` in Postgres, where the readers are.
The broker must allow transactions (a single-node broker needs
transaction.state.log.replication.factor=1 and transaction.state.log.min.isr=1; ops/
sets them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, cast

import faust
import orjson
from faust.tables.wrappers import WindowWrapper

from stream_jobs.errors import StreamJobsError
from stream_jobs.history.reports import ReportSlots
from stream_jobs.history.store import TOTAL_SIZE_S, HistoryStore, WindowRow
from stream_jobs.history.tally import Tally
from stream_jobs.history.windows import (
    HOURS_KEPT_S,
    MINUTES_KEPT_S,
    SLOTS_KEPT,
    Windows,
    slot_deltas,
    window_start,
)
from stream_jobs.kafka.connection import sasl_options, ssl_context
from stream_jobs.naming import history_app_id, history_topic, stats_topic
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.history")

# Postgres rows are written in batches of up to this many window tallies, or every second.
SINK_BATCH = 500
# How often old windows are deleted from Postgres, and how often `last-seen` forgets
# workers that stopped reporting (in reports folded).
PRUNE_EVERY_S = 600.0
FORGET_EVERY = 200


def credentials(settings: Settings) -> Any:
    """faust's credentials for the settings' Kafka security (checked and loaded as every
    other client of ours does), or None for PLAINTEXT."""
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = ssl_context(settings) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    sasl = sasl_options(settings)
    return faust.SASLCredentials(username=sasl["sasl_plain_username"],
                                 password=sasl["sasl_plain_password"],
                                 mechanism=sasl["sasl_mechanism"], ssl_context=context)


class History:
    """The faust app and its tables, agents and sink."""

    def __init__(self, settings: Settings, *, replication: int = 1,
                 store: HistoryStore | None = None) -> None:
        self.settings = settings
        self.windows = Windows(settings.history_window_s)
        self.store = store or HistoryStore(settings)
        prefix = settings.topic_prefix
        self.app = faust.App(
            history_app_id(prefix),
            broker=[f"kafka://{server}" for server in settings.bootstrap_servers],
            broker_credentials=credentials(settings),
            processing_guarantee="exactly_once",
            store="memory://",
            topic_partitions=1,
            topic_replication_factor=replication,
            datadir=str(settings.history_data_dir),
            web_enabled=False,
            autodiscover=False,
            # A history process killed -9 is replaced after this long, not faust's 60 s.
            broker_session_timeout=10.0,
            broker_heartbeat_interval=1.0,
            table_cleanup_interval=60.0,
        )
        self.reports = self.app.topic(stats_topic(prefix), key_serializer="raw",
                                      value_serializer="raw")
        self.out = self.app.topic(history_topic(prefix), key_serializer="raw",
                                  value_serializer="raw")
        self.last_seen = self.app.Table("last-seen", default=dict, partitions=1)
        self.totals = self.app.Table("totals", default=dict, partitions=1)
        minute_s, hour_s = self.windows.minute_s, self.windows.hour_s
        # Tumbling windows; `relative_to(t)` (of the class: faust's protocol type lacks
        # it) puts a slot's delta in the window of the slot's start, not of the report.
        self.sized: tuple[tuple[int, WindowWrapper], ...] = (
            (minute_s, cast(WindowWrapper, self.app.Table(
                "minutes", default=dict, partitions=1).tumbling(
                    minute_s, expires=timedelta(seconds=MINUTES_KEPT_S)))),
            (hour_s, cast(WindowWrapper, self.app.Table(
                "hours", default=dict, partitions=1).tumbling(
                    hour_s, expires=timedelta(seconds=HOURS_KEPT_S)))),
        )
        self._folded = 0
        self.app.agent(self.reports, name="fold")(self._fold)
        self.app.agent(self.out, name="sink")(self._sink)
        self.app.timer(PRUNE_EVERY_S, name="prune")(self._prune)

    # -- folding reports ---------------------------------------------------------------------

    async def _fold(self, stream: Any) -> AsyncIterator[None]:
        async for raw in stream:
            report = ReportSlots.from_json(raw)
            if report is not None:
                await self.fold(report)
            yield None

    async def fold(self, report: ReportSlots) -> None:
        """Add what `report` says that its worker's previous report did not."""
        before = {int(start): Tally.from_obj(obj)
                  for start, obj in self.last_seen[report.worker_id].get("slots", {}).items()}
        after = report.slots
        deltas = slot_deltas(before, after)
        for start, delta in deltas:
            for size_s, table in self.sized:
                begins = window_start(start, size_s)
                at = table.relative_to(begins / 1000)
                tally = Tally.from_obj(at[report.job_type].current()).plus(delta)
                at[report.job_type] = tally.to_obj()
                await self._send(WindowRow(report.job_type, size_s, begins, tally))
        if deltas:
            grand = Tally.from_obj(self.totals[report.job_type])
            for _, delta in deltas:
                grand = grand.plus(delta)
            self.totals[report.job_type] = grand.to_obj()
            await self._send(WindowRow(report.job_type, TOTAL_SIZE_S, 0, grand))
        if report.final:
            self.last_seen.pop(report.worker_id, None)
        else:
            self.last_seen[report.worker_id] = {
                "at_ms": report.at_ms, "slot_ms": report.slot_ms,
                "slots": {str(s): t.to_obj() for s, t in after.items()}}
        self._folded += 1
        if self._folded % FORGET_EVERY == 0:
            self._forget_silent(report.at_ms)

    def _forget_silent(self, now_ms: int) -> None:
        """Drop workers whose last report is older than the slots a worker keeps: a
        report of theirs would no longer repeat anything we hold (killed workers)."""
        for worker_id, seen in list(self.last_seen.items()):
            horizon_ms = (SLOTS_KEPT + 1) * int(seen.get("slot_ms", 60_000))
            if now_ms - int(seen.get("at_ms", 0)) > horizon_ms:
                self.last_seen.pop(worker_id, None)

    async def _send(self, row: WindowRow) -> None:
        key = f"{row.job_type}|{row.size_s}|{row.start_ms}".encode()
        value = orjson.dumps({"job_type": row.job_type, "size_s": row.size_s,
                              "start_ms": row.start_ms, "tally": row.tally.to_obj()})
        await self.out.send(key=key, value=value)

    # -- the Postgres sink -------------------------------------------------------------------

    async def _sink(self, stream: Any) -> AsyncIterator[None]:
        async for batch in stream.take(SINK_BATCH, within=1.0):
            latest: dict[tuple[str, int, int], WindowRow] = {}
            for raw in batch:
                row = _row(raw)
                if row is not None:
                    latest[(row.job_type, row.size_s, row.start_ms)] = row
            if latest:
                await self._put(list(latest.values()))
            yield None

    async def _put(self, rows: list[WindowRow]) -> None:
        """Write `rows`, waiting out a Postgres outage: the batch's offsets are committed
        only after it, so nothing committed is skipped."""
        pause = 0.5
        while True:
            try:
                await self.store.put(rows)
                return
            except StreamJobsError as exc:
                log.warning("history windows not written yet (again in %.0f s): %s", pause, exc)
                await asyncio.sleep(pause)  # a back-off between attempts, not a wait for a state
                pause = min(pause * 2, 30.0)

    async def _prune(self) -> None:
        try:
            gone = await self.store.prune(self.windows)
        except StreamJobsError as exc:  # Postgres away: the next round tries again
            log.warning("old history windows not pruned: %s", exc)
        else:
            if gone:
                log.info("pruned %d old history windows", gone)


def _row(raw: bytes) -> WindowRow | None:
    try:
        data = orjson.loads(raw)
        return WindowRow(str(data["job_type"]), int(data["size_s"]), int(data["start_ms"]),
                         Tally.from_obj(data["tally"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        log.warning("a record of the history topic is not a window, skipped: %s", exc)
        return None


__all__ = ["History", "credentials"]
