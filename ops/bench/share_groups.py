"""Kafka share groups (KIP-932) against our consumer-group worker, side by side in one run
(issue 29, point 5):

    BENCH_ONLY=share .venv/bin/python -m ops.bench.run      # about 4 minutes

Share groups hand a partition's records to any number of consumers, each record acquired
under a lock and acknowledged on its own, with a delivery count. confluent-kafka's
`ShareConsumer` (a preview in 2.16, synchronous) is the only Python client. Every
contender drains the same backlog of our job records (our client, our headers, an
unordered type) on a 2-partition topic, in processes of its own, rotating the order:

- **share x1, share x4**: 1 or 4 `python -m ops.bench.share_groups share ...` processes in
  a fresh share group (`share.auto.offset.reset=earliest`, set before it first joins).
  Each runs our job path on an asyncio loop: the consumer lives on one thread of its own
  (it is not thread-safe), `poll` runs there through `run_in_executor`, every record is
  decoded by `stream_jobs.record.decode_record`, its payload parsed by the handler's
  `parse_payload`, a `JobContext` made and the async handler awaited (up to `concurrency`
  at once, as our worker runs them), then each record is ACCEPTed explicitly and the acks
  committed (`commit_async`, carried with the next fetch; `commit_sync` at the end).
  What a share mode of our runtime would add per job (admission, outcomes, metrics,
  history) is not in it: it is the floor of such a mode's cost.
- **our worker** (`share.ref_group_*`): `Worker.run(until_idle=True)` of the type,
  `ordering="unordered"`, in a process of its own, its group rewound to 0 between drains.

Each is timed from its first handler end to its last (the drain) and from its start
(before the consumer or worker exists) to its last handler end; the difference is the
join, about 5 s for a share consumer. The broker's CPU seconds are read from /proc over
each contender, whole (join and close included), and its busy cores over the 0.5 s
before it (the stack's broker is shared with other work). Two handlers: a no-op (concurrency 64)
on an `enqueue_many` backlog, and a 2 ms `asyncio.sleep` run one job at a time per
consumer (concurrency 1) on a backlog enqueued one job at a time (a share consumer
acquires a whole producer batch per poll, whatever `max.poll.records` says). There a
consumer group of 2 partitions has at most 2 busy consumers, a share group as many as it
has members; our worker at concurrency 64 on the same jobs is what an unordered type does
today.

**Redelivery**: a consumer (`victim`) acquires a batch and is SIGKILLed without
acknowledging it while a second consumer of the group runs; the second one stamps the
records it gets again (`delivery_count() >= 2`). Reported: from the kill to the first
record seen again and to the backlog's last, and the delivery counts, on the 2-partition
topic (each consumer is assigned a partition of its own) and on a 1-partition one (both
share it). The group's record lock is set to the broker's minimum, 15 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ops.bench.backlog import fill, payload, rewind_worker_group
from ops.bench.common import (
    Bench,
    BenchError,
    Results,
    Tally,
    declare_one,
    rotated,
    run_async,
    stop_sessions,
)
from ops.bench.cpu import process_cpu_s
from ops.bench.kafka_tools import java, run_tool
from ops.bench.ours import until_idle
from ops.bench.scaling import log_tail
from ops.bench.snapshot import CODE_DIR, PROJECT_PYTHON
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import BadRecord
from stream_jobs.naming import lane_topic
from stream_jobs.record import decode_record
from stream_jobs.settings import Settings, load_settings
from stream_jobs.stack import KafkaCluster
from stream_jobs.stack.kafka import resolve_jars

if TYPE_CHECKING:
    from confluent_kafka import Message, ShareConsumer

HEADING = "Kafka share groups"
PREFIX = "share."
# Described, not judged: whether a share mode would pay is the section's closing note.
GOALS: list[tuple[str, str, str | None, str, float, str]] = []
NOOP_TYPE = "bench.share-noop"
IO_TYPE = "bench.share-io"
REDELIVER_TYPE = "bench.share-redeliver"
REDELIVER_ONE_TYPE = "bench.share-redeliver1"
PARTITIONS = 2
SHARE_COUNTS = (1, 4)
SLEEP_MS = 2
IO_N, QUICK_IO_N = 2_000, 600
REDELIVER_N = 1_000
# The broker's floor for a record's acquisition lock (group.share.min.record.lock.duration.ms):
# the redelivery group asks for it, so a lock that expires does so as early as it can.
LOCK_MIN_MS = 15_000
POLL_S = 0.2
BACKGROUND_S = 0.5
# librdkafka's default; it caps a poll only where producer batches are smaller (one job
# per enqueue), else a poll returns a whole producer batch.
MAX_POLL_RECORDS = 500
# A consumer running one job at a time takes this many per poll, so the members sharing a
# partition share its backlog (at 500 one member could acquire a quarter of it at once).
IO_POLL_RECORDS = 10
PROGRESS = struct.Struct("<I")  # one per handled poll batch: its record count
RATIOS = [
    # The share path is our decode-to-handler path without the runtime around a job
    # (admission, outcomes, history, metrics): a floor, not like for like.
    ("no-op drain: share x1 (job path only) / our worker", "share.noop_s1",
     "share.ref_group_noop"),
    ("no-op drain: share x4 (job path only) / our worker", "share.noop_s4",
     "share.ref_group_noop"),
    ("no-op start to last: share x1 / our worker", "share.noop_s1_start",
     "share.ref_group_noop_start"),
    ("2 ms jobs one at a time: share x4 / share x1", "share.io_s4", "share.io_s1"),
    ("2 ms jobs one at a time: share x4 / our worker (concurrency 1)", "share.io_s4",
     "share.ref_group_io_c1"),
    ("2 ms jobs: share x4 (one at a time each) / our worker (concurrency 64)", "share.io_s4",
     "share.ref_group_io_c64"),
    ("broker CPU per job, no-op: share x1 / our worker", "share.broker_us_noop_s1",
     "share.ref_group_broker_us_noop"),
]


# -- pure: the figures of a drain and of the broker's features ------------------------------


@dataclass(frozen=True)
class ConsumerReport:
    """What one share consumer process handled, on `time.monotonic()` (one clock for all
    processes on Linux). `first`/`last` are its first and last handler ends; `positions`
    each record's (partition, offset); `delivery_counts` how many records came with each
    count, and `redelivered_at` when the first with a count of 2 or more came."""

    started: float
    first: float | None
    last: float | None
    positions: list[tuple[int, int]]
    delivery_counts: dict[int, int]
    redelivered_at: float | None = None
    bad: int = 0
    max_batch: int = 0

    @property
    def count(self) -> int:
        return len(self.positions)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConsumerReport:
        return cls(started=data["started"], first=data["first"], last=data["last"],
                   positions=[(p, o) for p, o in data["positions"]],
                   delivery_counts={int(k): v for k, v in data["delivery_counts"].items()},
                   redelivered_at=data.get("redelivered_at"), bad=data.get("bad", 0),
                   max_batch=data.get("max_batch", 0))


def drain_figures(reports: Sequence[ConsumerReport], n: int) -> dict[str, Any]:
    """The figures of one share drain by `len(reports)` consumers of a backlog of `n`:
    the rate from the first handler end (any consumer) to the last, the same from the
    earliest start, the join (earliest start to first end) and each consumer's count.
    BenchError unless the consumers handled the `n` records exactly once between them."""
    positions = [p for r in reports for p in r.positions]
    if sum(r.bad for r in reports):
        raise BenchError(f"{sum(r.bad for r in reports)} records were not our jobs")
    if len(positions) != n or len(set(positions)) != n:
        raise BenchError(f"the share consumers handled {len(positions)} records "
                         f"({len(set(positions))} distinct) of a backlog of {n}")
    firsts = [r.first for r in reports if r.first is not None]
    lasts = [r.last for r in reports if r.last is not None]
    first, last, started = min(firsts), max(lasts), min(r.started for r in reports)
    if n < 2 or last <= first:
        raise BenchError(f"too few records ({n}) to time")
    return {"rate": (n - 1) / (last - first), "start_to_last_rate": n / (last - started),
            "join_s": first - started, "drain_s": last - first,
            "per_consumer": [r.count for r in reports],
            "max_batch": max(r.max_batch for r in reports),
            "redelivered": sum(c for r in reports for k, c in r.delivery_counts.items()
                               if k >= 2)}


def redelivery_figures(witness: ConsumerReport, killed_at: float, acquired: int,
                       n: int) -> dict[str, Any]:
    """What the second consumer saw after the first was killed holding `acquired` records:
    seconds from the kill to the first record delivered again and to the backlog's last,
    and the delivery counts it saw. BenchError when nothing came back or records were
    lost."""
    if witness.redelivered_at is None or witness.last is None:
        raise BenchError("no record came back after the kill")
    if witness.count != n or len(set(witness.positions)) != n:
        raise BenchError(f"the second consumer handled {witness.count} records of {n}")
    again = sum(c for k, c in witness.delivery_counts.items() if k >= 2)
    return {"kill_to_first_s": witness.redelivered_at - killed_at,
            "kill_to_last_s": witness.last - killed_at, "acquired": acquired,
            "delivered_again": again,
            "delivery_counts": {str(k): v for k, v in sorted(witness.delivery_counts.items())}}


def finalized_level(describe: str, feature: str) -> int | None:
    """A feature's FinalizedVersionLevel in `kafka-features describe` output, or None when
    it is not listed (not finalized)."""
    for line in describe.splitlines():
        if re.match(rf"Feature:\s*{re.escape(feature)}\s", line):
            found = re.search(r"FinalizedVersionLevel:\s*(\d+)", line)
            return int(found.group(1)) if found else None
    return None


# -- the processes: a share consumer, a victim and our worker -------------------------------


def _consumer_config(settings: Settings, group: str, max_poll_records: int) -> dict[str, Any]:
    return {"bootstrap.servers": settings.kafka_bootstrap, "group.id": group,
            "share.acknowledgement.mode": "explicit", "client.id": f"bench-{os.getpid()}",
            "max.poll.records": max_poll_records}


def _open(settings: Settings, group: str, topic: str,
          max_poll_records: int = MAX_POLL_RECORDS) -> ShareConsumer:
    from confluent_kafka import ShareConsumer

    consumer = ShareConsumer(_consumer_config(settings, group, max_poll_records))
    consumer.subscribe([topic])
    return consumer


def _step(consumer: ShareConsumer, handled: Sequence[Message]) -> list[Message]:
    """ACCEPT the batch just handled, commit the acks (sent with the next fetch), and poll
    the next batch. Runs on the consumer's own thread."""
    from confluent_kafka import AcknowledgeType

    for message in handled:
        consumer.acknowledge(message, AcknowledgeType.ACCEPT)
    if handled:
        consumer.commit_async()
    batch = consumer.poll(POLL_S)
    for message in batch:
        if message.error() is not None:
            raise BenchError(f"share consumer: {message.error()}")
    return list(batch)


def _close(consumer: ShareConsumer, handled: Sequence[Message]) -> None:
    from confluent_kafka import AcknowledgeType

    for message in handled:
        consumer.acknowledge(message, AcknowledgeType.ACCEPT)
    consumer.commit_sync(30)
    consumer.close()


async def _bounded(batch: Sequence[Message], run_one: Callable[[Message], Awaitable[None]],
                   concurrency: int) -> None:
    """`run_one` for each record of the batch, up to `concurrency` at once."""
    records: Iterator[Message] = iter(batch)

    async def lane() -> None:
        for message in records:  # one iterator shared: each record taken once
            await run_one(message)

    if concurrency <= 1:
        await lane()
    else:
        await asyncio.gather(*(lane() for _ in range(min(concurrency, len(batch)))))


async def share_consume(settings: Settings, job_type: str, group: str, concurrency: int,
                        sleep_ms: int, max_poll_records: int, progress: Path
                        ) -> dict[str, Any]:
    """Drain `job_type`'s topic in share group `group` with our job path until SIGTERM;
    returns the `ConsumerReport` fields. Appends each handled batch's size to `progress`."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    app = App(settings)
    sleep_s = sleep_ms / 1000

    @app.job(job_type, ordering="unordered", concurrency=concurrency)
    async def handle(job: dict[str, Any], ctx: JobContext) -> None:
        if sleep_s:
            await asyncio.sleep(sleep_s)

    handler = app.handler(job_type)
    dedup = DedupStore(settings)  # opened on a handler's first `ctx.once()`: never here
    limit = settings.max_payload_bytes
    found: dict[str, Any] = {"positions": [], "first": None, "last": None, "bad": 0,
                             "redelivered_at": None, "max_batch": 0}
    counts: Counter[int] = Counter()

    async def run_one(message: Message) -> None:
        try:
            job = decode_record(key=message.key(), value=message.value(),
                                headers=cast(Sequence[tuple[str, bytes]],
                                             message.headers() or []),
                                expected_type=job_type, max_payload_bytes=limit,
                                check_json=False)
            payload = handler.parse_payload(job.payload)
        except BadRecord:
            found["bad"] += 1
            return
        partition, offset = message.partition() or 0, message.offset() or 0
        ctx = JobContext(job, topic=message.topic() or "", partition=partition, offset=offset,
                         dedup=dedup)
        await handle(payload, ctx)
        now = time.monotonic()
        found["first"] = found["first"] or now
        found["last"] = now
        found["positions"].append((partition, offset))
        delivered = message.delivery_count() or 1
        counts[delivered] += 1
        if delivered >= 2 and found["redelivered_at"] is None:
            found["redelivered_at"] = now

    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="share-consumer")
    found["started"] = time.monotonic()
    topic = lane_topic(settings.topic_prefix, job_type)
    consumer = await loop.run_in_executor(thread, _open, settings, group, topic,
                                          max_poll_records)
    handled: list[Message] = []
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while not stop.is_set():
            handled = await loop.run_in_executor(thread, _step, consumer, handled)
            if handled:
                await _bounded(handled, run_one, concurrency)
                found["max_batch"] = max(found["max_batch"], len(handled))
                os.write(fd, PROGRESS.pack(len(handled)))
        await loop.run_in_executor(thread, _close, consumer, handled)
    finally:
        os.close(fd)
        thread.shutdown(wait=False)
    return {**found, "delivery_counts": dict(counts)}


def victim(settings: Settings, job_type: str, group: str, report: Path) -> None:
    """Poll once, write what was acquired to `report`, and hold it unacknowledged until
    killed."""
    consumer = _open(settings, group, lane_topic(settings.topic_prefix, job_type))
    while not (batch := [m for m in consumer.poll(POLL_S) if m.error() is None]):
        pass
    report.write_text(json.dumps({"acquired": len(batch), "at": time.monotonic(),
                                  "partitions": sorted({m.partition() or 0 for m in batch}),
                                  "delivery_counts": sorted({m.delivery_count() or 1
                                                             for m in batch})}))
    while True:
        time.sleep(60)  # holding the records is the point: the parent kills this process


async def group_drain(settings: Settings, job_type: str, n: int, concurrency: int,
                      sleep_ms: int) -> dict[str, float]:
    """Our worker (ordering=unordered) drains the type's backlog of exactly `n` jobs: the
    drain's rate (first handler end to last), its start-up, and start to last."""
    app = App(settings)
    tally = Tally()
    sleep_s = sleep_ms / 1000

    @app.job(job_type, ordering="unordered", concurrency=concurrency)
    async def handle(job: dict[str, Any], ctx: JobContext) -> None:
        if sleep_s:
            await asyncio.sleep(sleep_s)
        tally.hit()

    found = await until_idle(app, job_type, n, tally, timeout_s=600)
    return {**found, "start_to_last_s": found["startup_s"] + tally.last - tally.first}


def main(argv: Sequence[str]) -> int:
    """`share TYPE GROUP CONCURRENCY SLEEP_MS MAX_POLL_RECORDS FOLDER` (report and
    progress in FOLDER),
    `victim TYPE GROUP REPORT`, `group TYPE N CONCURRENCY SLEEP_MS` (JSON on stdout)."""
    settings = load_settings()
    role, job_type = argv[0], argv[1]
    if role == "share":
        folder = Path(argv[6])
        found = run_async(share_consume(settings, job_type, argv[2], int(argv[3]),
                                        int(argv[4]), int(argv[5]), folder / "progress"),
                          3600)
        (folder / "report.json").write_text(json.dumps(found))
    elif role == "victim":
        victim(settings, job_type, argv[2], Path(argv[3]))
    elif role == "group":
        print(json.dumps(run_async(group_drain(settings, job_type, int(argv[2]),
                                               int(argv[3]), int(argv[4])), 900)), flush=True)
    else:
        raise BenchError(f"unknown role {role!r}")
    return 0


# -- I/O: the share group's settings and the broker -----------------------------------------


def _admin(settings: Settings) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap})


def prepare_group(settings: Settings, group: str, lock_ms: int | None = None) -> None:
    """Set `share.auto.offset.reset=earliest` (and a record lock) on a share group before
    it first joins, so it reads the backlog produced before it."""
    # Re-exported without `__all__` in confluent-kafka 2.16, which mypy strict refuses.
    from confluent_kafka.admin import (  # type: ignore[attr-defined,unused-ignore]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entries = [ConfigEntry("share.auto.offset.reset", "earliest",
                           incremental_operation=AlterConfigOpType.SET)]
    if lock_ms is not None:
        entries.append(ConfigEntry("share.record.lock.duration.ms", str(lock_ms),
                                   incremental_operation=AlterConfigOpType.SET))
    admin = _admin(settings)  # kept referenced until the futures resolve
    futures = admin.incremental_alter_configs([ConfigResource(
        ResourceType.GROUP, group, incremental_configs=entries)])
    for future in futures.values():
        future.result(timeout=30)


def group_configs(settings: Settings, group: str) -> dict[str, str]:
    """The share group's `share.*` settings as the broker reports them."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined,unused-ignore]

    admin = _admin(settings)
    futures = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)])
    found: dict[str, str] = {}
    for future in futures.values():
        for name, entry in future.result(timeout=30).items():
            if name.startswith("share."):
                found[name] = str(entry.value)
    return found


def share_version(b: Bench) -> int | None:
    """share.version's finalized level on the broker (`kafka-features describe`)."""
    lib = resolve_jars(b.stack_settings())
    out = run_tool(java(lib, "org.apache.kafka.tools.FeatureCommand", "--bootstrap-server",
                        b.settings().kafka_bootstrap, "describe"), 120)
    return finalized_level(out, "share.version")


def broker_pids(b: Bench) -> list[int]:
    return [row.pid for row in KafkaCluster(b.stack_settings(), 1).status()
            if row.pid is not None]


def _broker_cpu(pids: Sequence[int]) -> float:
    return sum(process_cpu_s(pid) for pid in pids)


def broker_background(pids: Sequence[int], window_s: float = BACKGROUND_S) -> float:
    """The broker's busy cores over `window_s` before a contender starts: the stack's broker
    is shared, and what others make it do during a contender counts in its CPU too."""
    before = _broker_cpu(pids)
    time.sleep(window_s)  # the sampling window itself
    return (_broker_cpu(pids) - before) / window_s


# -- I/O: one contender's drain -------------------------------------------------------------


def _spawn(b: Bench, args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([str(PROJECT_PYTHON), "-m", "ops.bench.share_groups", *args],
                                cwd=CODE_DIR, env=b.env(), stdout=subprocess.DEVNULL,
                                stderr=out, start_new_session=True)


def _handled(folders: Sequence[Path]) -> int:
    total = 0
    for folder in folders:
        path = folder / "progress"
        if path.is_file():
            raw = path.read_bytes()
            total += sum(c for (c,) in PROGRESS.iter_unpack(raw[:len(raw) - len(raw)
                                                                 % PROGRESS.size]))
    return total


def _until_handled(procs: Sequence[subprocess.Popen[bytes]], folders: Sequence[Path], n: int,
                   timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (done := _handled(folders)) < n:
        for proc, folder in zip(procs, folders, strict=True):
            if proc.poll() is not None:
                raise BenchError(f"a share consumer exited with {proc.returncode} after "
                                 f"{done} of {n} records: {log_tail(folder / 'log')}")
        if time.monotonic() > deadline:
            raise BenchError(f"the share consumers handled {done} of {n} records in "
                             f"{timeout_s:.0f} s")
        time.sleep(0.05)  # polling the progress files: there is no event to wait on


def _reports(procs: Sequence[subprocess.Popen[bytes]],
             folders: Sequence[Path]) -> list[ConsumerReport]:
    reports = []
    for proc, folder in zip(procs, folders, strict=True):
        if proc.returncode != 0 or not (folder / "report.json").is_file():
            raise BenchError(f"a share consumer exited with {proc.returncode}: "
                             f"{log_tail(folder / 'log')}")
        reports.append(ConsumerReport.from_json(json.loads((folder / "report.json").read_text())))
    return reports


def share_drain(b: Bench, job_type: str, n: int, consumers: int, concurrency: int,
                sleep_ms: int, tag: str) -> dict[str, Any]:
    """`consumers` share consumer processes drain the backlog of `n` in a fresh group;
    one-at-a-time consumers take IO_POLL_RECORDS per poll, the others the default."""
    max_poll = IO_POLL_RECORDS if concurrency == 1 else MAX_POLL_RECORDS
    group = f"{b.prefix}.share-{tag}"
    prepare_group(b.settings(), group)
    folders = [b.out_dir / "share" / tag / f"c{index}" for index in range(consumers)]
    pids = broker_pids(b)
    background = broker_background(pids)
    before = _broker_cpu(pids)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            procs.append(_spawn(b, ["share", job_type, group, str(concurrency), str(sleep_ms),
                                    str(max_poll), str(folder)], folder / "log"))
        _until_handled(procs, folders, n, 120 + n * max(sleep_ms, 1) / 100)
    finally:
        stop_sessions(procs, within_s=30)
    broker_s = _broker_cpu(pids) - before
    figures = drain_figures(_reports(procs, folders), n)
    return {**figures, "consumers": consumers, "concurrency": concurrency,
            "sleep_ms": sleep_ms, "max_poll_records": max_poll, "broker_cpu_s": broker_s,
            "broker_us_per_job": broker_s * 1e6 / n, "broker_background": background,
            "load_avg_after": os.getloadavg()[0]}


def worker_drain(b: Bench, job_type: str, n: int, concurrency: int,
                 sleep_ms: int) -> dict[str, Any]:
    """Our worker drains the backlog of `n` in a process of its own; rewound after."""
    pids = broker_pids(b)
    background = broker_background(pids)
    before = _broker_cpu(pids)
    done = subprocess.run([str(PROJECT_PYTHON), "-m", "ops.bench.share_groups", "group",
                           job_type, str(n), str(concurrency), str(sleep_ms)], cwd=CODE_DIR,
                          env=b.env(), capture_output=True, text=True, timeout=1000,
                          check=False)
    broker_s = _broker_cpu(pids) - before
    run_async(rewind_worker_group(b.settings(), job_type), 60)
    if done.returncode != 0:
        raise BenchError(f"our worker's drain failed: {done.stderr[-600:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {"rate": found["rate"], "join_s": found["startup_s"],
            "start_to_last_rate": n / found["start_to_last_s"], "consumers": 1,
            "concurrency": concurrency, "sleep_ms": sleep_ms, "broker_cpu_s": broker_s,
            "broker_us_per_job": broker_s * 1e6 / n, "broker_background": background,
            "load_avg_after": os.getloadavg()[0]}


# -- I/O: redelivery after a kill -----------------------------------------------------------


def redelivery(b: Bench, job_type: str, tag: str) -> dict[str, Any]:
    """A victim acquires a batch of `job_type`'s backlog and is SIGKILLed while a second
    consumer runs; what the second one gets again, and when."""
    n = REDELIVER_N
    group = f"{b.prefix}.share-{tag}"
    prepare_group(b.settings(), group, LOCK_MIN_MS)
    configs = group_configs(b.settings(), group)
    folder = b.out_dir / "share" / tag
    witness_folder = folder / "c0"
    witness_folder.mkdir(parents=True, exist_ok=True)
    report = folder / "victim.json"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_spawn(b, ["victim", job_type, group, str(report)],
                            folder / "victim.log"))
        deadline = time.monotonic() + 60
        while not report.is_file():
            if procs[0].poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the victim acquired nothing: {log_tail(folder / 'victim.log')}")
            time.sleep(0.05)  # polling for its report: there is no event to wait on
        acquired = json.loads(report.read_text())
        procs.append(_spawn(b, ["share", job_type, group, "64", "0", str(MAX_POLL_RECORDS),
                                str(witness_folder)], witness_folder / "log"))
        # The kill waits until the second consumer has handled a record (it has joined and
        # fetches), or for 10 s (twice a join) when the victim holds all there is.
        joined = time.monotonic() + 10
        while _handled([witness_folder]) == 0 and time.monotonic() < joined:
            time.sleep(0.05)  # as above
        before_kill = _handled([witness_folder])
        killed_at = time.monotonic()
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait(timeout=30)
        _until_handled(procs[1:], [witness_folder], n, 120)
    finally:
        stop_sessions(procs, within_s=30)
    witness = _reports(procs[1:], [witness_folder])[0]
    found = redelivery_figures(witness, killed_at, acquired["acquired"], n)
    return {**found, "victim": acquired, "before_kill": before_kill, "group_configs": configs,
            "victim_acquired_to_kill_s": killed_at - acquired["at"]}


# -- the section ----------------------------------------------------------------------------


def _contenders(io: bool) -> list[tuple[str, int, int]]:
    """(name, consumers (0: our worker), concurrency) of one handler's contenders."""
    if io:
        return [("s1", 1, 1), ("s4", 4, 1), ("group_c1", 0, 1), ("group_c64", 0, 64)]
    return [("s1", 1, 64), ("s4", 4, 64), ("group", 0, 64)]


async def enqueue_one_by_one(settings: Settings, job_type: str, n: int) -> None:
    """`await client.enqueue(...)` `n` times: a record per producer batch, as jobs enqueued
    one at a time by a web app arrive (a share consumer acquires a whole producer batch
    at once, whatever `max.poll.records` says, so `enqueue_many` backlogs would hand one
    consumer hundreds of slow jobs)."""
    async with App(settings).client() as client:
        for i in range(n):
            await client.enqueue(job_type, payload(i))


def _redeliveries(b: Bench, details: dict[str, Any]) -> None:
    """The kill on the section's 2-partition topic (each of the 2 consumers has a partition
    of its own) and on a 1-partition one (both share it); figures for each."""
    for tag, job_type, partitions in (("redeliver", REDELIVER_TYPE, PARTITIONS),
                                      ("redeliver1", REDELIVER_ONE_TYPE, 1)):
        print(f"[bench] share {tag}: a consumer killed holding records", flush=True)
        try:
            found = details[tag] = {**redelivery(b, job_type, tag), "partitions": partitions}
        except BenchError as exc:
            details[tag] = {"failed": str(exc), "partitions": partitions}
            continue
        on = f"{partitions} partition{'s' if partitions > 1 else ''}, 2 consumers"
        b.results.add(f"share.{tag}_first_s", f"kill to the first record delivered again, "
                      f"{on}", "s", [found["kill_to_first_s"]],
                      f"{found['acquired']} acquired by the killed one; delivery counts seen "
                      f"{found['delivery_counts']}")
        b.results.add(f"share.{tag}_last_s", f"kill to the backlog's last record, {on}", "s",
                      [found["kill_to_last_s"]], f"{REDELIVER_N:,} jobs")


def share(b: Bench) -> None:
    began = time.monotonic()
    details: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "quick": b.quick,
        "nproc": os.cpu_count(), "load_avg_before": os.getloadavg()[0],
        "partitions": PARTITIONS, "sleep_ms": SLEEP_MS, "runs": []}
    b.results.details["share"] = details
    import confluent_kafka

    details["client"] = (f"confluent-kafka {metadata.version('confluent-kafka')} "
                         f"(librdkafka {confluent_kafka.libversion()[0]})")
    details["share_version"] = share_version(b)
    if not details["share_version"]:
        raise BenchError("share.version is not finalized on the broker: no share groups")
    details["broker_pids"] = broker_pids(b)
    sizes = {NOOP_TYPE: b.scale.backlog_n, IO_TYPE: QUICK_IO_N if b.quick else IO_N}
    details["backlogs"] = {"noop": sizes[NOOP_TYPE], "io": sizes[IO_TYPE],
                           "redeliver": REDELIVER_N}
    s = b.settings()
    for job_type, partitions in ((NOOP_TYPE, PARTITIONS), (IO_TYPE, PARTITIONS),
                                 (REDELIVER_TYPE, PARTITIONS), (REDELIVER_ONE_TYPE, 1)):
        run_async(declare_one(s, job_type, partitions=partitions, retry_tiers=["5s"],
                              max_attempts=2, retention="2h"), 60)
    run_async(fill(s, NOOP_TYPE, sizes[NOOP_TYPE]), 600)
    run_async(enqueue_one_by_one(s, IO_TYPE, sizes[IO_TYPE]), 600)
    for job_type in (REDELIVER_TYPE, REDELIVER_ONE_TYPE):
        run_async(fill(s, job_type, REDELIVER_N), 120)
    for run in range(b.scale.runs):
        for handler, job_type in rotated([("noop", NOOP_TYPE), ("io", IO_TYPE)], run):
            io = handler == "io"
            for name, consumers, concurrency in rotated(_contenders(io), run):
                tag = f"{handler}-{name}-r{run}"
                print(f"[bench] share {tag}", flush=True)
                n, sleep_ms = sizes[job_type], SLEEP_MS if io else 0
                found = (share_drain(b, job_type, n, consumers, concurrency, sleep_ms, tag)
                         if consumers else worker_drain(b, job_type, n, concurrency, sleep_ms))
                details["runs"].append({**found, "handler": handler, "name": name,
                                        "run": run + 1, "n": n})
    drain_figures_of(b.results, details["runs"])
    _redeliveries(b, details)
    details["load_avg_after"] = os.getloadavg()[0]
    details["took_s"] = round(time.monotonic() - began, 1)


def drain_figures_of(results: Results, runs: list[dict[str, Any]]) -> None:
    """The section's drain figures from its runs: `share.<handler>_<contender>` and our
    worker's `share.ref_group_<handler>[_c<concurrency>]`, with the no-op's start to last,
    join and broker CPU per job."""
    def values(handler: str, name: str, key: str) -> list[float]:
        return [r[key] for r in runs if r["handler"] == handler and r["name"] == name]

    add = results.add
    for handler, label in (("noop", "no-op"), ("io", f"{SLEEP_MS} ms sleep")):
        for name, consumers, concurrency in _contenders(handler == "io"):
            if not values(handler, name, "rate"):
                continue
            who = (f"share x{consumers}" if consumers else "our worker") + \
                f", concurrency {concurrency}"
            # share.noop_s1, share.io_s4; share.ref_group_noop, share.ref_group_io_c64
            figure = (f"share.{handler}_{name}" if consumers else
                      f"share.ref_group_{handler}{name.removeprefix('group')}")
            add(figure, f"{label}, {who}: drain", "jobs/s", values(handler, name, "rate"),
                "first handler end to last; 2 partitions")
            if handler == "noop":
                start = (f"share.noop_{name}_start" if consumers
                         else "share.ref_group_noop_start")
                add(start, f"{label}, {who}: start to last", "jobs/s",
                    values(handler, name, "start_to_last_rate"), "join included")
                join = f"share.join_{name}" if consumers else "share.ref_group_join"
                add(join, f"{who}: start to first job", "s", values(handler, name, "join_s"))
                broker = (f"share.broker_us_noop_{name}" if consumers
                          else "share.ref_group_broker_us_noop")
                add(broker, f"{label}, {who}: broker CPU per job", "us",
                    values(handler, name, "broker_us_per_job"),
                    "the broker's CPU over the whole contender (join and close included)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
