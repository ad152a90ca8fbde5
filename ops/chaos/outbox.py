"""The outbox while Kafka is away: `CHAOS_ONLY=outbox make chaos` (a 30 s outage).

A broker of its own (a folder and free loopback ports of its own, never the stack's),
the stack's Postgres with a fresh schema, one relay in this process. Writers commit jobs
through `enqueue(conn=...)` before, during and after the outage; the broker is killed
with SIGKILL and started again on the same data after `OUTBOX_OUTAGE_S` seconds. What it
checks: the callers' commits never waited on Kafka, the rows waited in the outbox, and
once the broker was back every committed job reached Kafka (duplicates allowed, none
lost). `make chaos` runs it (`TRIAL`, the protocol of ops/chaos/protocol.py);
`tests/integration/test_outbox_faults.py` runs the same trial with a short outage.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import asyncpg

from ops.chaos.fresh import fresh_settings
from ops.chaos.protocol import OwnTrial, TrialRow, row
from ops.chaos.trial import Stack
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.kafka import scan
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.naming import lane_topic
from stream_jobs.outbox.depth import read_depth
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster
from stream_jobs.testing.stack import declare_type, drop_schema

log = logging.getLogger("ops.chaos.outbox")
JOB_TYPE = "chaos.outbox"
OUTAGE_S = 30.0
JOBS_PER_S = 200.0
TITLE = "Kafka killed for 30 s under transactional enqueues"
METHOD = ("A broker of its own (a folder and loopback ports of its own, never the stack's), "
          "the stack's Postgres with a fresh schema, one outbox relay in the runner. Writers "
          "commit 10 jobs a transaction through `enqueue(conn=...)`, 200 jobs/s, before, "
          "during and after the outage; the broker is killed with SIGKILL and started again "
          "on the same data after 30 s. Judged: jobs were committed while Kafka was down, "
          "their rows waited in the outbox, and once the broker was back every committed "
          "job reached Kafka (duplicates allowed, none lost); the slowest commit shows that "
          "the callers' transactions never waited on Kafka.")


@dataclass
class OutageResult:
    """What one outage trial saw."""

    outage_s: float  # asked for: how long the broker stays killed
    down_s: float  # measured: from the kill until the restarted broker answered
    committed: int
    committed_during_outage: int
    max_depth: int  # rows waiting at most, during the outage
    delivered: int  # distinct job IDs in Kafka at the end
    duplicates: int
    lost: int
    slowest_commit_s: float  # the callers' transactions, Kafka or not
    recovery_s: float  # from the broker being back to an empty outbox
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def free_port_pair() -> int:
    """A loopback port with the next one free too (the controller listens on port + 1),
    below the ephemeral range, where outgoing connections could take it meanwhile."""
    for _ in range(200):
        port = random.randint(29_000, 31_998)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of loopback ports")


class OwnBroker:
    """A single Kafka broker in a temporary folder, for faults the stack's must not see."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="stream-jobs-outbox-chaos-"))
        self.cluster = KafkaCluster(Settings(stack_dir=self.root,
                                             dev_kafka_port=free_port_pair(),
                                             dev_kafka_heap_mb=256), 1)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    async def up(self) -> None:
        await asyncio.to_thread(self.cluster.up)

    def kill(self) -> None:
        self.cluster.kill_node(1)
        self.cluster.nodes[0].pid_file.unlink(missing_ok=True)

    def remove(self) -> None:
        self.cluster.down()
        shutil.rmtree(self.root, ignore_errors=True)


async def _writer(app: App, settings: Settings, per_s: float, stop: asyncio.Event,
                  committed: list[tuple[float, str]], slowest: list[float]) -> None:
    """Commit one transaction of 10 jobs every 10/per_s seconds until `stop`."""
    client = app.client()  # never entered: these writes need no Kafka
    conn = await asyncpg.connect(settings.database_url)
    try:
        interval_s = 10 / per_s
        due = time.monotonic()
        n = 0
        while not stop.is_set():
            began = time.monotonic()
            async with conn.transaction():
                ids = await client.enqueue_many(
                    [Job(JOB_TYPE, {"n": n + i}, key=f"k{(n + i) % 7}") for i in range(10)],
                    conn=conn)
            slowest[0] = max(slowest[0], time.monotonic() - began)
            committed.extend((time.time(), job_id) for job_id in ids)
            n += 10
            due += interval_s
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # the writers' pace
    finally:
        await conn.close()


async def _delivered(settings: Settings) -> list[str]:
    topic = lane_topic(settings.topic_prefix, JOB_TYPE)
    found: list[str] = []
    async with open_reader(settings, client_id="outbox-chaos-check") as consumer:
        await consumer.refresh_metadata()
        ranges = await scan.ranges(consumer, topic)
        async for record in scan.scan(consumer, topic, ranges):
            found.extend(v.decode() for k, v in record.headers if k == HEADER_JOB_ID)
    return found


async def _kill_and_restart(broker: OwnBroker, settings: Settings, outage_s: float,
                            before_s: float) -> tuple[float, float, int]:
    """Kill the broker after `before_s` of traffic, keep it down `outage_s` while sampling
    the outbox's depth, start it again: (when it went down, seconds until it answered
    again, the most rows waiting)."""
    await asyncio.sleep(before_s)  # traffic flows before the fault
    broker.kill()
    down_at = time.time()
    max_depth = 0
    deadline = time.monotonic() + outage_s
    while time.monotonic() < deadline:  # the outage's length, sampling the depth
        max_depth = max(max_depth, (await read_depth(settings)).depth)
        await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    await broker.up()
    return down_at, time.time() - down_at, max_depth


async def _emptied(settings: Settings, since: float, within_s: float) -> float | None:
    """Seconds from `since` (monotonic) until the outbox is empty; None when rows still
    wait `within_s` after it."""
    while (await read_depth(settings)).depth:
        if time.monotonic() - since > within_s:
            return None
        await asyncio.sleep(0.2)
    return time.monotonic() - since


async def outage_trial(broker: OwnBroker, database_url: str, *, outage_s: float,
                       jobs_per_s: float = JOBS_PER_S, before_s: float = 2.0,
                       recovery_within_s: float = 120.0) -> OutageResult:
    """One trial on `broker` (started by the caller) and the database at `database_url`."""
    scratch = Path(tempfile.mkdtemp(prefix="outbox-chaos-"))
    settings, _ = fresh_settings(
        Settings(kafka_bootstrap=broker.bootstrap, database_url=database_url,
                 kafka_request_timeout_ms=5_000, outbox_sweep_interval_s=1.0),
        scratch, "outbox")
    await prepare_schema(settings)
    await declare_type(settings, JOB_TYPE, partitions=3)
    committed: list[tuple[float, str]] = []
    slowest = [0.0]
    stop_writing, stop_relay = asyncio.Event(), asyncio.Event()
    relaying = asyncio.create_task(OutboxRelay(settings).run(stop_relay))
    writing = asyncio.create_task(_writer(App(settings), settings, jobs_per_s, stop_writing,
                                          committed, slowest))
    problems: list[str] = []
    try:
        down_at, down_s, max_depth = await _kill_and_restart(broker, settings, outage_s,
                                                             before_s)
        back_at = time.monotonic()
        await asyncio.sleep(1.0)  # a little traffic after the broker is back
        stop_writing.set()
        await writing
        recovery_s = await _emptied(settings, back_at, recovery_within_s)
    finally:
        stop_writing.set()
        stop_relay.set()
        await asyncio.gather(writing, relaying, return_exceptions=True)
        shutil.rmtree(scratch, ignore_errors=True)
    if recovery_s is None:
        problems.append(f"rows still waiting {recovery_within_s:.0f} s after the broker came "
                        "back")
        recovery_s = time.monotonic() - back_at
    seen = await _delivered(settings)
    ids = {job_id for _, job_id in committed}
    lost = len(ids - set(seen))
    during = sum(1 for at, _ in committed if down_at <= at <= down_at + outage_s)
    if lost:
        problems.append(f"{lost} committed jobs never reached Kafka")
    if during == 0:
        problems.append("no job was committed while Kafka was down")
    if max_depth == 0:
        problems.append("no row waited in the outbox during the outage")
    await drop_schema(settings)  # its topics go with its broker
    return OutageResult(outage_s, round(down_s, 1), len(ids), during, max_depth, len(set(seen)),
                        len(seen) - len(set(seen)), lost, round(slowest[0], 3),
                        round(recovery_s, 2), problems)


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    """One run at `make chaos`'s size (the outage is a time: CHAOS_JOBS does not apply)."""
    started = time.time()
    broker = OwnBroker()
    try:
        await broker.up()
        result = await outage_trial(broker, stack.settings.database_url, outage_s=OUTAGE_S)
    finally:
        broker.remove()
    counts = {k: v for k, v in asdict(result).items() if k != "problems"}
    return row(run, started, result.problems, **counts)


def _cells(r: TrialRow) -> list[str]:
    return [f"{r['down_s']:g}", f"{r['committed']:,}", f"{r['committed_during_outage']:,}",
            f"{r['max_depth']:,}", f"{r['delivered']:,}", str(r["duplicates"]),
            str(r["lost"]), f"{r['slowest_commit_s']:g}", f"{r['recovery_s']:g}",
            f"{r['seconds']:.0f}", "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"Kafka down {r['down_s']:g} s: {r['committed']} committed "
            f"({r['committed_during_outage']} during the outage, up to {r['max_depth']} rows "
            f"waiting), {r['delivered']} delivered, {r['duplicates']} duplicates, "
            f"{r['lost']} lost; slowest commit {r['slowest_commit_s']} s; outbox empty "
            f"{r['recovery_s']} s after the broker was back")


TRIAL = OwnTrial(
    "outbox", "The outbox through a Kafka outage", TITLE, METHOD, _run,
    ("Kafka down s", "committed", "committed during the outage", "most rows waiting",
     "delivered", "duplicates", "lost", "slowest commit s",
     "outbox empty s after the broker was back", "run s", "ok"), _cells, _summary)
