"""Worker reports: each worker publishes its cumulative outcome counters to `P._stats`.

`stream-jobs stats` turns two reports of one worker into rates (done, retried,
dead-lettered, expired per second) and sums them per type. A report is small JSON keyed
by the worker's ID, readable by any Kafka tool. Reports are best effort: a report that
cannot be written is logged and skipped; jobs never wait on it. A report also says which
process the worker is (host, pid, package version), the lane partitions it holds, and the
jobs in its handlers, oldest first (`RunningJob`, at most `RUNNING_SHOWN`; `running_count`
counts them all): what `stream-jobs running` and `workers` read; and its tenants
(`stream_jobs.fairness.tally`): what `stream-jobs stats T --tenants` reads. Shadow consumers
(`worker --shadow`) publish `ShadowReport`s to the same topic, marked `"shadow": true`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, Protocol

import orjson

from stream_jobs.errors import StreamJobsError
from stream_jobs.kafka.clients import AIOKAFKA, KafkaClients, Producer
from stream_jobs.naming import STATS_TOPIC_CONFIG, stats_topic
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.reports")

# The running jobs a report lists (the oldest): a report stays small with any concurrency.
RUNNING_SHOWN = 50

def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def package_version() -> str:
    """The installed stream-jobs version ("unknown" when run from a tree not installed)."""
    try:
        return metadata.version("stream-jobs")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class RunningJob:
    """One job in a worker's handler: since `started_at_ms`, from its lane record."""

    job_id: str
    attempt: int
    topic: str
    partition: int
    offset: int
    started_at_ms: int

    @classmethod
    def of(cls, data: Any) -> RunningJob:
        return cls(str(data["job_id"]), int(data["attempt"]), str(data["topic"]),
                   int(data["partition"]), int(data["offset"]), int(data["started_at_ms"]))


@dataclass(frozen=True)
class WorkerReport:
    """One worker's state at `at_ms`; counters are cumulative since `started_at_ms`."""

    job_type: str
    worker_id: str
    at_ms: int
    started_at_ms: int
    outcomes: dict[str, int] = field(default_factory=dict)
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    released: int = 0  # delay-tier records the relay put back in their lanes
    final: bool = False  # the worker stopped after this report
    interval_s: float = 5.0  # how often this worker reports (liveness is judged by it)
    # The type's rate limit this worker applies, where it comes from ("toml", "throttle",
    # "drain", "none"), and this worker's share of it (jobs/s; None without a limit).
    rate_limit_per_s: float | None = None
    rate_source: str = "none"
    rate_share_per_s: float | None = None
    # (lane topic, partition, write time in ms of the newest heartbeat processed there).
    heartbeats: tuple[tuple[str, int, int], ...] = ()
    # History (stream_jobs/history/): this worker's tallies per slot of `slot_ms`, by slot
    # start in ms, each cumulative within its slot (`Tally.to_obj()`; parsed by the reader).
    slot_ms: int = 0
    slots: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The process (empty in reports of workers older than these fields).
    host: str = ""
    pid: int = 0
    version: str = ""
    # (lane topic, partition) of each lane partition assigned to this worker now.
    partitions: tuple[tuple[str, int], ...] = ()
    # The oldest jobs in its handlers (at most RUNNING_SHOWN), and how many there are.
    running: tuple[RunningJob, ...] = ()
    running_count: int = 0
    # Its tenants: the top ones by jobs held and dwell, the rest summed
    # (`stream_jobs.fairness.tally.TenantSection.to_obj()`; parsed by the reader).
    tenants: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        # Counters are keyed by outcome and reason codes (StrEnums).
        return orjson.dumps(asdict(self), option=orjson.OPT_NON_STR_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | None) -> WorkerReport | None:
        """The report in `raw`, or None for anything that is not one (never raises)."""
        try:
            data: Any = orjson.loads(raw or b"")
            if isinstance(data, dict) and data.get("shadow"):
                return None  # a ShadowReport: counts what a shadow saw, no outcomes
            return cls(
                job_type=str(data["job_type"]), worker_id=str(data["worker_id"]),
                at_ms=int(data["at_ms"]), started_at_ms=int(data["started_at_ms"]),
                outcomes={str(k): int(v) for k, v in dict(data.get("outcomes", {})).items()},
                dead_letter_reasons={str(k): int(v) for k, v in
                                     dict(data.get("dead_letter_reasons", {})).items()},
                in_flight=int(data.get("in_flight", 0)), released=int(data.get("released", 0)),
                final=bool(data.get("final", False)),
                interval_s=float(data.get("interval_s", 5.0)),
                rate_limit_per_s=_optional_float(data.get("rate_limit_per_s")),
                rate_source=str(data.get("rate_source", "none")),
                rate_share_per_s=_optional_float(data.get("rate_share_per_s")),
                heartbeats=tuple((str(topic), int(part), int(at_ms))
                                 for topic, part, at_ms in data.get("heartbeats", ())),
                slot_ms=int(data.get("slot_ms", 0)),
                slots={int(start): dict(tally)
                       for start, tally in dict(data.get("slots", {})).items()},
                host=str(data.get("host", "")), pid=int(data.get("pid", 0)),
                version=str(data.get("version", "")),
                partitions=tuple((str(topic), int(part))
                                 for topic, part in data.get("partitions", ())),
                running=tuple(RunningJob.of(job) for job in data.get("running", ())),
                running_count=int(data.get("running_count", 0)),
                tenants=dict(data.get("tenants") or {}),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


def _optional_float(raw: object) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"not a number: {raw!r}")
    return float(raw)


@dataclass(frozen=True)
class LaneSeen:
    """Records a shadow read from one lane partition: jobs, and records that are not."""

    valid: int = 0
    undecodable: int = 0


@dataclass(frozen=True)
class ShadowReport:
    """A shadow consumer's counts at `at_ms` (`worker --shadow`), cumulative since
    `started_at_ms`, by lane and partition. Published to `P._stats` with `"shadow": true`,
    which `WorkerReport.from_json` skips."""

    job_type: str
    worker_id: str
    at_ms: int
    started_at_ms: int
    lanes: dict[str, dict[int, LaneSeen]] = field(default_factory=dict)
    undecodable_reasons: dict[str, int] = field(default_factory=dict)
    final: bool = False
    interval_s: float = 5.0

    @property
    def valid(self) -> int:
        return sum(s.valid for parts in self.lanes.values() for s in parts.values())

    @property
    def undecodable(self) -> int:
        return sum(s.undecodable for parts in self.lanes.values() for s in parts.values())

    def to_json(self) -> bytes:
        data = asdict(self)
        data["lanes"] = {lane: {str(p): asdict(seen) for p, seen in parts.items()}
                         for lane, parts in self.lanes.items()}
        return orjson.dumps({"shadow": True, **data}, option=orjson.OPT_NON_STR_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | None) -> ShadowReport | None:
        """The shadow report in `raw`, or None for anything that is not one (never raises)."""
        try:
            data: Any = orjson.loads(raw or b"")
            if not isinstance(data, dict) or data.get("shadow") is not True:
                return None
            return cls(
                job_type=str(data["job_type"]), worker_id=str(data["worker_id"]),
                at_ms=int(data["at_ms"]), started_at_ms=int(data["started_at_ms"]),
                lanes={str(lane): {int(p): LaneSeen(int(seen.get("valid", 0)),
                                                    int(seen.get("undecodable", 0)))
                                   for p, seen in dict(parts).items()}
                       for lane, parts in dict(data.get("lanes", {})).items()},
                undecodable_reasons={str(k): int(v) for k, v in
                                     dict(data.get("undecodable_reasons", {})).items()},
                final=bool(data.get("final", False)),
                interval_s=float(data.get("interval_s", 5.0)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None


async def ensure_stats_topic(settings: Settings, kafka: KafkaClients = AIOKAFKA) -> None:
    """Create `P._stats` if it is missing (one partition, one day of reports)."""
    await kafka.ensure_internal_topic(settings, stats_topic(settings.topic_prefix),
                                      STATS_TOPIC_CONFIG)


class Report(Protocol):
    """What a member publishes to `P._stats` (a worker's or a shadow's report)."""

    def to_json(self) -> bytes: ...


async def publish(settings: Settings, producer: Producer, member_id: str,
                  report: Report) -> None:
    """Write one report; a report that cannot be written is logged and skipped."""
    try:
        await producer.send_raw(stats_topic(settings.topic_prefix), member_id.encode(),
                                report.to_json(), [])
    except StreamJobsError as exc:
        log.warning("report of %s not written: %s", member_id, exc)


async def publish_every(settings: Settings, producer: Producer, member_id: str,
                        report: Callable[[], Report], interval_s: float, *,
                        kafka: KafkaClients = AIOKAFKA) -> None:
    """Publish `report()` every `interval_s` until cancelled (the stats topic made first)."""
    try:
        await ensure_stats_topic(settings, kafka)
    except StreamJobsError as exc:
        log.warning("cannot create the stats topic; reports are skipped: %s", exc)
    while True:
        await publish(settings, producer, member_id, report())
        await asyncio.sleep(interval_s)  # a period, not a wait for a condition
