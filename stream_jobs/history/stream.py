"""The history process: a faust-streaming app that folds the workers' reports into
windows, each report counted once.

It reads `P._stats` (every worker's report: its slots, see `windows.SlotTallies`) and
keeps, in faust tables whose changelogs are Kafka topics:

- `minutes` and `hours`: per type, a tally per tumbling window (a minute, kept 7 days; an
  hour, kept 90 days);
- `totals`: per type, the running total since history began;

each beside what it already counted of each worker (`windows.Folded`). Its Kafka work
is at least once: faust uses transactions only inside its own `faust worker` command,
which this app is not started by, so offsets are committed plainly and a restart may be
handed reports its restored tables already hold. So each table value also keeps, per
worker, the time of the last report folded into it, and a report no newer adds nothing:
every value is exact and idempotent by itself, whatever faust replays. faust's consumer
also dropped records handed while its flow was suspended on a rebalance, then again as
already read once fetched anew: `ReadOffsets` keeps their read offset from moving
meanwhile. A second agent reads `P._history.windows` and sets those rows of
`stream_jobs_history` in Postgres, where the readers are.
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
    Folded,
    Windows,
    in_window,
    window_start,
)
from stream_jobs.kafka.connection import sasl_options, ssl_context
from stream_jobs.naming import history_app_id, history_topic, stats_topic
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.history")

# Postgres rows are written in batches of up to this many window tallies, or every second.
SINK_BATCH = 500
# How often old windows are deleted from Postgres.
PRUNE_EVERY_S = 600.0


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
            # What faust does outside its own worker command anyway (module docstring).
            processing_guarantee="at_least_once",
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
        self.app.agent(self.reports, name="fold")(self._fold)
        self.app.agent(self.out, name="sink")(self._sink)
        self.app.timer(PRUNE_EVERY_S, name="prune")(self._prune)
        keep_records_handed_while_paused(self.app.consumer, rereadable={stats_topic(prefix)},
                                         held={history_topic(prefix)})

    # -- folding reports ---------------------------------------------------------------------

    async def _fold(self, stream: Any) -> AsyncIterator[None]:
        async for raw in stream:
            report = ReportSlots.from_json(raw)
            if report is not None:
                await self.fold(report)
            yield None

    async def fold(self, report: ReportSlots) -> None:
        """Fold `report` into its type's windows and running total. Each keeps what it
        already counted of each worker (`Folded`), so a report read again adds nothing."""
        horizon_ms = report.at_ms - (SLOTS_KEPT + 1) * report.slot_ms
        starts = sorted(report.slots)
        for size_s, table in self.sized:
            for begins in sorted({window_start(start, size_s) for start in starts}):
                # value(): the window of `relative_to`; current() would read the window of
                # the report's own timestamp.
                at = table.relative_to(begins / 1000)
                folded = Folded.from_obj(at[report.job_type].value()).fold(
                    report.worker_id, report.at_ms, in_window(report.slots, begins, size_s))
                if folded is not None:
                    folded.forget_before(horizon_ms)
                    at[report.job_type] = folded.to_obj()
                    await self._send(WindowRow(report.job_type, size_s, begins, folded.tally))
        grand = Folded.from_obj(self.totals[report.job_type]).fold(
            report.worker_id, report.at_ms, report.slots)
        if grand is not None:
            grand.forget_before(horizon_ms)
            self.totals[report.job_type] = grand.to_obj()
            await self._send(WindowRow(report.job_type, TOTAL_SIZE_S, 0, grand.tally))

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


class ReadOffsets(dict[Any, int | None]):
    """faust's read offset per partition, kept so that no report is skipped across a
    rebalance.

    faust's consumer hands each fetched record to the app and then moves the partition's
    read offset past it; a record whose offset is below the read offset when it comes is
    dropped as already read. Across a rebalance it hands records that the app never
    folds (while its flow is suspended, or while its tables are still being restored),
    yet still moves the read offset past them: after the seek to the committed offset
    the same records came again and were dropped as read. The history trial lost a
    killed worker's last reports that way (2 runs in 25; up to 712 records dropped in
    one restart). For the `rereadable` topics (the reports, where a report read twice
    adds nothing, `Folded`) no record is ever dropped as read; for the `held` ones (the
    windows the sink writes, where order matters: an older tally after a newer one would
    set it back) the read offset moves forward only while the flow runs."""

    def __init__(self, consumer: Any, *, rereadable: set[str], held: set[str]) -> None:
        super().__init__()
        self._consumer = consumer
        self._rereadable = rereadable
        self._held = held

    def __missing__(self, tp: Any) -> None:
        return None

    def __getitem__(self, tp: Any) -> int | None:
        if tp.topic in self._rereadable:
            return None  # faust's test for "already read" lets every record through
        return super().__getitem__(tp)

    def __setitem__(self, tp: Any, offset: int | None) -> None:
        if tp.topic in self._held and not self._consumer.flow_active:
            current = self.get(tp)
            if offset is not None and (current is None or offset > current):
                return  # a record handed while paused is not read: it comes again
        super().__setitem__(tp, offset)


def keep_records_handed_while_paused(consumer: Any, *, rereadable: set[str],
                                     held: set[str]) -> None:
    """Give faust's `consumer` a `ReadOffsets` (before it runs)."""
    if not hasattr(consumer, "_read_offset") or not hasattr(consumer, "flow_active"):
        raise StreamJobsError("this faust-streaming keeps no read offsets where the history "
                              "expects them; its records could be skipped on a rebalance")
    offsets = ReadOffsets(consumer, rereadable=rereadable, held=held)
    offsets.update(consumer._read_offset)
    consumer._read_offset = offsets


def _row(raw: bytes) -> WindowRow | None:
    try:
        data = orjson.loads(raw)
        return WindowRow(str(data["job_type"]), int(data["size_s"]), int(data["start_ms"]),
                         Tally.from_obj(data["tally"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        log.warning("a record of the history topic is not a window, skipped: %s", exc)
        return None


__all__ = ["History", "ReadOffsets", "credentials", "keep_records_handed_while_paused"]
