"""Every table a command prints fits an 80-column terminal (issue 26): no line over 80, no
header cut ("retried…"), and every job ID whole on one line; `--wide` shows every column.

The tables are built from sample rows as long as real ones get (long type and topic
names, long errors), by the same functions the commands print with."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from rich.console import Console, RenderableType

from stream_jobs.cli.batch import open_table, progress_table
from stream_jobs.cli.dev import stack_table
from stream_jobs.cli.dlq import facts_table, reasons_table, rows_table
from stream_jobs.cli.outbox import failing_table
from stream_jobs.cli.replay import offsets_table, plan_table, skipped_table, written_table
from stream_jobs.cli.running import running_table, workers_table
from stream_jobs.cli.schedules import schedules_table
from stream_jobs.cli.stats import records_table, render_stats
from stream_jobs.cli.stats_history import render_history
from stream_jobs.cli.stats_tenants import render_tenants
from stream_jobs.cli.tables import (
    TERMINAL_COLUMNS,
    FittedTable,
    job_id_column,
    print_table,
    text_column,
)
from stream_jobs.cli.topics import changes_table, topics_table
from stream_jobs.cli.waiting import waiting_table
from stream_jobs.dlq.letters import LetterRow
from stream_jobs.dlq.listing import DlqListing, LetterDetail
from stream_jobs.failures import FailureInfo
from stream_jobs.fairness.census import TenantCensus, WaitingCount, fold
from stream_jobs.fairness.tally import TenantDwell, section_of
from stream_jobs.history.store import WindowRow
from stream_jobs.history.tally import Tally
from stream_jobs.history.view import HistoryView
from stream_jobs.history.windows import Windows
from stream_jobs.kafka.scan import PartitionRange
from stream_jobs.kafka.topics import TopicRow
from stream_jobs.lookup import JobLocation, Sighting
from stream_jobs.naming import TopicRole
from stream_jobs.outbox.depth import FailingRow, OutboxDepth
from stream_jobs.runtime.reports import RunningJob, WorkerReport
from stream_jobs.runtime.shadow import ShadowLane, ShadowStats
from stream_jobs.runtime.throttle import RateInForce
from stream_jobs.schedules.listing import ScheduleView
from stream_jobs.settings import Settings
from stream_jobs.stack.process import ServiceStatus
from stream_jobs.tools.group_offsets import OffsetChange
from stream_jobs.tools.replay import ReplayResult, Skipped
from stream_jobs.tools.running import RunningView
from stream_jobs.tools.type_stats import (
    OutcomeCounts,
    PartitionLag,
    Rates,
    StatsSnapshot,
    TopicLag,
    TypeStats,
)
from stream_jobs.waiting.dead import DeadPage
from stream_jobs.waiting.reading import WaitingPage
from stream_jobs.waiting.rows import DeadRow, WaitingRow
from stream_jobs.workflows.progress import Progress

NOW = 1_796_570_000_000
TYPE = "newsletter.send"  # longer than most type names
PREFIX = "production"
LANE = f"{PREFIX}.{TYPE}"
IDS = [f"0193{n:04x}-7b3c-7d4e-8f5a-6b7c8d9e{n:04x}" for n in range(1, 5)]
ERROR = ("stream_jobs.errors.PermanentError: the mail server refused the address "
         "someone@example.com (550 no such user here)")


def rendered(renderable: RenderableType, width: int = TERMINAL_COLUMNS, *,
             wide: bool = False) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_table(console, renderable, wide=wide)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


# -- sample rows, as long as real ones -------------------------------------------------------


def letter_rows() -> list[LetterRow]:
    return [LetterRow(job_id, "invalid-payload" if n else "permanent",
                      "stream_jobs.errors.PermanentError", ERROR[35:], attempt=3,
                      origin=f"{LANE}/{n}/{100 + n}", enqueued_at_ms=NOW - 60_000,
                      failed_at_ms=NOW, partition=n % 3, offset=1_000_000 + n, requeues=n,
                      runnable=n != 2, letters=1 + n % 2)
            for n, job_id in enumerate(IDS)]


def listing() -> DlqListing:
    return DlqListing(TYPE, f"{LANE}.dlq", 9, {"permanent": 3, "invalid-payload": 6}, 4,
                      letter_rows(), 0, jobs=4, job_reasons={"permanent": 1,
                                                             "invalid-payload": 3})


def detail() -> LetterDetail:
    failure = FailureInfo("permanent", "stream_jobs.errors.PermanentError", ERROR[35:],
                          "Traceback ...", NOW)
    return LetterDetail(TYPE, f"{LANE}.dlq", IDS[0], 11, 123_456, NOW, IDS[0],
                        [("sj-job-id", IDS[0]), ("sj-rerun-of", IDS[1]),
                         ("sj-origin", f"{LANE}.high/11/98765")],
                        "{}", True, failure, "permanent", 3, 1, None, [(11, 99), (11, 123_456)])


def location() -> JobLocation:
    failure = FailureInfo("invalid-payload", "stream_jobs.errors.PermanentError", "bad",
                          "", NOW)
    seen = [Sighting(LANE, "lane", "default", 11, 1_234_567, NOW, 1, behind_commit=True),
            Sighting(f"{LANE}.retry-5m", "tier", "5m", 3, 45_678, NOW, 2, behind_commit=True),
            Sighting(f"{LANE}.dlq", "dlq", "dlq", 0, 9_876, NOW, 3, failure=failure)]
    return JobLocation(IDS[0], "dead_lettered", TYPE, sightings=tuple(seen),
                       scanned_records=1_234_567)


def snapshot() -> StatsSnapshot:
    lanes = tuple(TopicLag(name, f"{LANE}{suffix}", True, 12_345, 3725.0,
                           (PartitionLag(11, 0, 1_234_567, 1_222_222, 12_345, 3725.0),))
                  for name, suffix in (("default", ""), ("high", ".high")))
    tier = TopicLag("5m", f"{LANE}.retry-5m", True, 300, None)
    workers = tuple(WorkerReport(job_type=TYPE, worker_id=f"w{n}", at_ms=NOW - 1000,
                                 started_at_ms=NOW - 10_000_000, outcomes={}, final=False,
                                 interval_s=5.0, in_flight=1000) for n in range(12))
    shadow = ShadowStats(f"{LANE}.shadow", (ShadowLane("default", LANE, 12_345, 1, 2),),
                         1_234_567, 12, 1_234_567, ("s1", "s2"), {})
    typed = TypeStats(TYPE, lanes, (tier,), f"{LANE}.dlq", 1234,
                      Rates(60, OutcomeCounts(done=600_000, retried=60_000, dead_lettered=6000,
                                              expired=600, cancelled=60, superseded=6)),
                      workers, shadow=shadow, rate=RateInForce(1500.0, "throttle"))
    return StatsSnapshot(NOW, PREFIX, 60, (typed,),
                         outbox=OutboxDepth("production_jobs", 12, 1.5, 0))


def history() -> HistoryView:
    tally = Tally({"succeeded": 123_456, "retried": 12_345, "dead_lettered": 1234})
    for _ in range(3):
        tally.observe(12.5, 300.0)
    found = [WindowRow(TYPE, 60, (NOW // 60_000 - m) * 60_000, tally) for m in range(0, 60, 7)]
    return HistoryView.of(TYPE, "1h", Windows(60), found, now_ms=NOW)


def progress(kind: str) -> Progress:
    created = datetime.fromtimestamp(NOW / 1000, UTC)
    return Progress(IDS[0], kind, 12_345, 12_000, 45, created, None, failed_step=2,
                    failure="permanent: " + ERROR, parent_job_id=IDS[1],
                    callbacks=(("on_success", IDS[2]), ("on_complete", IDS[3])))


def views() -> list[ScheduleView]:
    return [ScheduleView(TYPE, "weekly-digest", "cron 0 3 * * MON (Europe/Berlin)",
                         "Europe/Berlin", n == 1, NOW - 120_000 if n == 0 else NOW + 86_400_000,
                         n == 0, NOW - 3_600_000,
                         job_id, None, 3, "scheduler-7f9c@host-a.example.internal", None)
            for n, job_id in enumerate(IDS)]


def failing() -> list[FailingRow]:
    created = datetime.fromtimestamp(NOW / 1000, UTC)
    return [FailingRow(1000 + n, f"{LANE}.high", job_id, 7, created, created, ERROR)
            for n, job_id in enumerate(IDS)]


def topic_rows() -> list[TopicRow]:
    topics: list[tuple[str, TopicRole, str]] = [
        ("", "lane", "default"), (".high", "lane", "high"), (".retry-5m", "tier", "5m"),
        (".dlq", "dlq", "dlq")]
    return [TopicRow(f"{LANE}{suffix}", TYPE, role, name, 12, True, n != 2, 1_234_567,
                     123_456_789) for n, (suffix, role, name) in enumerate(topics)]


def replayed() -> ReplayResult:
    result = ReplayResult(f"{LANE}.dlq", [PartitionRange(n, 1_000_000, 1_234_567)
                                          for n in range(3)], "each job's own lane", False,
                          False, read=703_701, written=703_690)
    result.counts.update({(n, TYPE, f"{LANE}.high"): 234_567 for n in range(3)})
    result.skipped.extend(Skipped(0, 1_000_000 + n, "undecodable", ERROR) for n in range(3))
    result.skipped_total = 11
    return result


def running() -> RunningView:
    reports = tuple(WorkerReport(
        job_type=TYPE, worker_id=f"worker-7f9c4d8b6d-xk2lp-{n}-3fa9c1", at_ms=NOW - 2000,
        started_at_ms=NOW - 10_000_000, host="worker-7f9c4d8b6d-xk2lp", pid=123_456 + n,
        version="1.0.0rc3", partitions=tuple((f"{LANE}.high", p) for p in range(12)),
        running=tuple(RunningJob(job_id, 3, f"{LANE}.high", 11, 1_234_567, NOW - 4_000_000)
                      for job_id in IDS), in_flight=1000) for n in range(2))
    return RunningView(NOW, reports)


def waiting(state: str) -> WaitingPage | DeadPage:
    if state == "dead":
        return DeadPage(TYPE, [DeadRow(job_id, "invalid-payload", NOW, 12, 13, 11, 1_234_567)
                               for job_id in IDS], 1, 100_000, 50, None, 150, f"{LANE}.dlq",
                        NOW)
    failure = FailureInfo("retried", "stream_jobs.errors.RetryableError", ERROR[35:], "", NOW)
    rows = [WaitingRow(job_id, state, "10m" if state != "pending" else "default", 11,  # type: ignore[arg-type]
                       1_234_567, 3, NOW - 60_000, NOW - 600_000, NOW + 600_000,
                       failure if state == "retrying" else None) for job_id in IDS]
    return WaitingPage(TYPE, state, rows, 1, 100_000, 50, "c" * 60, False, 150,  # type: ignore[arg-type]
                       (f"{LANE}.retry-10m",), NOW)


def tenants() -> TenantCensus:
    """Tenants as long as a tenant may be (128 bytes), counts in the millions."""
    names = ["acme-" + "x" * 123, *(f"tenant-{n:03}" for n in range(40)), ""]
    dwell = TenantDwell()
    for name in names:
        dwell.observe(name, 3600.0)
    section = section_of(dwell, [[("sj-tenant", names[0].encode())]] * 1_000)
    return fold(TYPE, WaitingCount({name: 1_234_567 for name in names}, {names[0]: 123_456},
                                   100_000, False), [section], workers=12)


# -- every table command's tables, by the function it prints with ----------------------------


def tables(wide: bool) -> Iterator[tuple[str, RenderableType]]:
    settings = Settings(kafka_bootstrap="kafka-0.kafka.internal:9092,kafka-1.kafka.internal:9092")
    yield "stats", render_stats(snapshot(), settings, partitions=True, wide=wide)
    yield "stats --history", render_history(history())
    yield "stats --tenants", render_tenants(tenants(), wide=wide)
    yield "job", records_table(location(), wide=wide)
    yield "dlq list (reasons)", reasons_table(listing())
    yield "dlq list", rows_table(letter_rows(), wide=wide)
    yield "dlq show", facts_table(detail())
    yield "batch (batch)", progress_table(progress("batch"))
    yield "batch (chain)", progress_table(progress("chain"))
    yield "batch --open", open_table(4, [progress("batch")] * 4, wide=wide)
    yield "schedules list", schedules_table(views(), NOW, wide=wide)
    yield "outbox status", failing_table(failing(), wide=wide)
    yield "topics list", topics_table(topic_rows(), f"topics under {PREFIX!r} on "
                                             f"{settings.kafka_bootstrap}", wide=wide)
    yield "topics plan", changes_table([], "plan")
    yield "replay (plan)", plan_table(replayed())
    yield "replay (written)", written_table(replayed())
    yield "replay (skipped)", skipped_table(replayed())
    yield "offsets reset", offsets_table(f"{LANE}.worker", [
        OffsetChange(TopicPartition(f"{LANE}.high", n), 1_234_567, 1_000_000)
        for n in range(3)], dry_run=True)
    yield "running", running_table(running(), wide=wide)
    yield "workers", workers_table(running(), wide=wide)
    for state in ("pending", "scheduled", "retrying", "dead"):
        yield f"waiting --state {state}", waiting_table(waiting(state), wide=wide)
    yield "dev status", stack_table([ServiceStatus(
        "kafka", True, 12345, "127.0.0.1:9092", "STREAM_JOBS_KAFKA_BOOTSTRAP=127.0.0.1:9092",
        Path("/work/.stack/kafka/server.log"))])


NARROW = list(tables(wide=False))


@pytest.mark.parametrize(("name", "table"), NARROW, ids=[name for name, _ in NARROW])
def test_each_table_fits_80_columns_with_every_job_id_whole(name: str,
                                                            table: RenderableType) -> None:
    out = rendered(table)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= TERMINAL_COLUMNS, out
    assert "…" not in out, f"{name}: a header or cell is cut\n{out}"
    for job_id in IDS:
        if job_id[:8] in out:  # this table shows this ID (in full, or cut)
            assert any(job_id in line for line in lines), f"{name}: {job_id} is cut\n{out}"


def test_the_tables_that_name_jobs_show_them_at_80_columns() -> None:
    shown = {name for name, table in NARROW if IDS[0] in rendered(table)}
    assert shown >= {"job", "dlq list", "dlq show", "batch (batch)", "batch --open",
                     "outbox status", "running", "waiting --state pending",
                     "waiting --state scheduled", "waiting --state retrying",
                     "waiting --state dead"}


@pytest.mark.parametrize(("name", "narrow", "wide"), [
    ("stats", ("done/s", "retry/s", "dead/s", "workers", "limit", "commit"),
     ("expired/s", "cancel/s", "supersede/s", "in flight", "worker lag", "start", "end")),
    ("job", ("topic", "written (UTC)", "attempt", "state"), ("part", "offset")),
    ("dlq list", ("job ID", "reason", "error"),
     ("message", "attempt", "requeues", "letters", "failed at", "enqueued at", "origin",
      "partition/offset")),
    ("batch --open", ("id", "kind", "done", "failed"), ("created (UTC)", "pending")),
    ("schedules list", ("type", "schedule", "next fire", "paused"),
     ("fires", "last fired", "last job ID", "missed", "leader")),
    ("outbox status", ("job ID", "attempts", "last error"), ("topic", "retry at (UTC)")),
    ("topics list", ("topic", "role", "exists", "messages"), ("partitions", "written")),
    ("running", ("job ID", "type", "attempt", "running for"),
     ("worker", "topic", "part", "offset")),
    ("workers", ("host", "pid", "types", "in flight", "oldest", "report"),
     ("parts", "version", "partitions", "oldest job")),
    ("waiting --state retrying", ("job ID", "attempt", "tier", "due (UTC)"),
     ("age", "at", "last error")),
    ("waiting --state dead", ("job ID", "reason", "failed (UTC)"),
     ("requeues", "letters", "at")),
])
def test_wide_shows_every_column(name: str, narrow: tuple[str, ...],
                                 wide: tuple[str, ...]) -> None:
    short = headers(rendered(dict(NARROW)[name]))
    # In an 80-column terminal too: a --wide table is as wide as its columns need.
    whole = rendered(dict(tables(wide=True))[name], wide=True)
    full = headers(whole)
    assert set(narrow) <= short
    assert set(narrow) | set(wide) <= full
    assert not set(wide) & short
    assert "…" not in whole, whole
    assert max(len(line) for line in whole.splitlines()) > TERMINAL_COLUMNS


def headers(out: str) -> set[str]:
    """The header cells of every table in `out` (the lines rich draws with ┃)."""
    return {cell.strip() for line in out.splitlines() if "┃" in line
            for cell in line.split("┃") if cell.strip()}


def test_a_row_gives_every_cell_and_the_hidden_ones_are_dropped() -> None:
    columns = (job_id_column(), text_column("note", wide=True))
    table = FittedTable(columns, wide=False)
    table.add_row(IDS[0], "a note")
    assert "a note" not in rendered(table)
    with pytest.raises(ValueError, match="a row of 1 cells for 2 columns"):
        table.add_row(IDS[0])


def test_a_job_id_is_never_folded_even_in_a_narrow_table() -> None:
    table = FittedTable((job_id_column(), text_column("error")), wide=False)
    table.add_row(IDS[0], ERROR)
    out = rendered(table, width=50)
    assert any(IDS[0] in line for line in out.splitlines()), out

