"""Capacity arithmetic: from a load to partitions, brokers, disk, worker processes and the
dedup database, and which limit is reached first. Pure functions, no I/O.

`ops/capacity.py` is the command line around `plan()`; docs/capacity.md works through
50 million and 1.4 billion jobs a day with it. Sizes are decimal (1 GB = 10^9 bytes).

The per-process throughputs are inputs, not facts about your handlers: the defaults are
deliberately conservative and should be replaced by what `make bench` measures on your
hardware (and by your own handlers' figures once they do real work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

SECONDS_PER_DAY = 86_400
# Kafka rolls a partition's log into 1 GiB segments and deletes whole segments only,
# so each busy partition keeps up to one segment beyond its retention.
SEGMENT_BYTES = 1 << 30

Prune = Literal["partitions", "delete"]


@dataclass(frozen=True)
class Inputs:
    """Everything the model needs; each field is a command-line option of ops/capacity.py."""

    jobs_per_day: float
    peak_per_s: float | None = None  # the measured peak; else peak_factor x the average
    peak_factor: float = 3.0
    job_bytes: float = 2_000  # a record as stored: payload, key and headers
    retention_s: float = 7 * SECONDS_PER_DAY  # of the lanes (topics/T.toml `retention`)
    outage_s: float = 600  # workers down at peak for this long
    catch_up_s: float = 1_800  # drain that backlog within this, while the peak goes on
    # Jobs/s one worker process sustains: INPUTS, replace with `make bench` figures.
    noop_per_process: float = 5_000
    once_per_process: float = 1_500
    once_fraction: float = 1.0  # share of jobs whose handler writes through ctx.once()
    retry_fraction: float = 0.05  # share of jobs that fail once (written again to a tier)
    replication_factor: int = 3
    disk_per_broker_bytes: float = 8e12
    disk_fill: float = 0.7  # fill disks to this share at most
    broker_write_bytes_per_s: float = 100e6  # per broker, leader and follower writes
    partition_write_bytes_per_s: float = 10e6  # per partition, to keep replication easy
    partition_growth: float = 2.0  # partitions for this many times today's processes
    spare_processes: int = 1  # one process down (crash, rolling deploy) costs no lag
    dedup_keep_s: float | None = None  # how long dedup rows are kept; default: retention
    dedup_row_bytes: float = 200  # row plus its two index entries (159 B fresh, measured)
    dedup_linger_ms: float = 3.0  # STREAM_JOBS_DEDUP_LINGER_MS
    dedup_batch_max: int = 60  # STREAM_JOBS_DEDUP_BATCH_MAX (capped at 60)
    prune: Prune = "partitions"  # drop time partitions, or DELETE rows (`db prune`)
    pg_rows_per_s: float = 25_000  # dedup rows one Postgres primary inserts (and deletes)
    pg_commits_per_s: float = 5_000  # transactions it commits (each one a WAL flush)
    pg_disk_bytes: float = 2e12  # disk of the dedup database

    def __post_init__(self) -> None:
        positive = ("jobs_per_day", "peak_factor", "job_bytes", "retention_s", "catch_up_s",
                    "noop_per_process", "once_per_process", "disk_per_broker_bytes",
                    "broker_write_bytes_per_s", "partition_write_bytes_per_s",
                    "partition_growth", "dedup_row_bytes", "pg_rows_per_s",
                    "pg_commits_per_s", "pg_disk_bytes")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than zero")
        if self.peak_per_s is not None and not self.peak_per_s > 0:
            raise ValueError("peak_per_s must be more than zero")
        for name in ("once_fraction", "retry_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1")
        if not 0 < self.disk_fill <= 1:
            raise ValueError("disk_fill must be in (0, 1]")
        if self.replication_factor < 1 or self.dedup_batch_max < 1:
            raise ValueError("replication_factor and dedup_batch_max must be at least 1")
        if self.outage_s < 0 or self.dedup_linger_ms < 0 or self.spare_processes < 0:
            raise ValueError("outage_s, dedup_linger_ms and spare_processes cannot be negative")


# ---------------------------------------------------------------------------------------
# The pieces.


def average_per_s(jobs_per_day: float) -> float:
    """Jobs per second spread evenly over a day."""
    return jobs_per_day / SECONDS_PER_DAY


def blended_per_process(inputs: Inputs) -> float:
    """Jobs/s one process sustains for the mix: time per job is the weighted mean."""
    f = inputs.once_fraction
    return 1 / (f / inputs.once_per_process + (1 - f) / inputs.noop_per_process)


def processes_for(rate_per_s: float, per_process: float) -> int:
    """Worker processes that carry `rate_per_s` (at least one)."""
    return max(1, math.ceil(rate_per_s / per_process - 1e-9))


def round_partitions(n: float) -> int:
    """At least `n`, rounded up to a count that splits evenly over many process counts:
    a multiple of 6 up to 12, of 12 beyond (divisible by 1, 2, 3, 4, 6 and 12)."""
    step = 6 if n <= 12 else 12
    return max(step, step * math.ceil(n / step - 1e-9))


def batch_size(per_process_rows_per_s: float, linger_ms: float, batch_max: int) -> float:
    """Jobs in one group-commit transaction: what one process gathers in a linger, 1..60."""
    return min(float(min(batch_max, 60)), max(1.0, per_process_rows_per_s * linger_ms / 1000))


@dataclass(frozen=True)
class Limit:
    """One limit that does not grow by adding brokers or processes: how much of it is used."""

    name: str
    used: float
    capacity: float
    unit: str
    fix: str

    @property
    def utilisation(self) -> float:
        return self.used / self.capacity


@dataclass(frozen=True)
class Plan:
    """What a load needs. Rates are jobs/s, sizes bytes; see `plan()` for the reasoning."""

    inputs: Inputs
    average_per_s: float
    peak_per_s: float
    peak_bytes_per_s: float
    backlog_jobs: float
    backlog_bytes: float
    catch_up_per_s: float
    retention_covers_outage: bool
    per_process: float
    processes_noop_peak: int
    processes_once_peak: int
    processes_catch_up: int
    processes: int
    partitions: int
    retained_bytes: float  # one copy of what the lanes and tiers keep
    segment_slack_bytes: float  # one copy
    disk_bytes: float  # all replicas, at the fill target
    brokers_for_disk: int
    brokers_for_writes: int
    brokers: int
    dedup_rows_peak_per_s: float
    dedup_batch: float
    dedup_commits_peak_per_s: float
    dedup_deletes_per_s: float
    dedup_rows_kept: float
    dedup_table_bytes: float
    limits: tuple[Limit, ...] = field(default_factory=tuple)

    @property
    def breaks_first(self) -> Limit:
        """The fixed limit closest to (or furthest past) its capacity."""
        return max(self.limits, key=lambda limit: limit.utilisation)

    def breaking_jobs_per_day(self, limit: Limit) -> float:
        """About the daily load at which `limit` is reached (the limits grow ~linearly)."""
        return self.inputs.jobs_per_day / limit.utilisation


def plan(inputs: Inputs) -> Plan:
    """Size one job type (or a system whose load all goes through one type) for `inputs`.

    - Load: the average is jobs/day over 86,400 s; the backlog of an outage is the peak
      rate times its length, and it must be drained (`catch_up_s`) while the peak goes on.
    - Processes: enough for the catch-up rate at the blended per-process throughput, plus
      spares; partitions: processes x growth (a partition feeds one process at a time, and
      adding partitions later moves keys), rounded to an even count, and enough that no
      partition takes more than `partition_write_bytes_per_s`.
    - Disk: what the lanes keep for `retention_s` at the average rate, plus the retries
      written again to tiers, plus a segment per partition, times the replicas, at the
      fill target. The outage backlog is inside the retention (it is the same records,
      read late); it matters only if the retention is shorter than outage plus catch-up.
    - Brokers: the most of the replication factor, the disk, and the peak writes.
    - Dedup: one row per `ctx.once()` job; group commit puts the jobs one process gathers
      in a linger into one transaction; rows are kept `dedup_keep_s` (default: retention,
      so a job Kafka can still deliver again still finds its row).
    """
    avg = average_per_s(inputs.jobs_per_day)
    peak = inputs.peak_per_s if inputs.peak_per_s is not None else avg * inputs.peak_factor
    peak_bytes = peak * inputs.job_bytes
    backlog = peak * inputs.outage_s
    catch_up = peak + backlog / inputs.catch_up_s
    per_process = blended_per_process(inputs)

    processes_catch_up = processes_for(catch_up, per_process)
    processes = processes_catch_up + inputs.spare_processes
    partitions = round_partitions(max(
        processes * inputs.partition_growth,
        peak_bytes * (1 + inputs.retry_fraction) / inputs.partition_write_bytes_per_s))

    rf = inputs.replication_factor
    retained = avg * inputs.job_bytes * inputs.retention_s * (1 + inputs.retry_fraction)
    slack = partitions * SEGMENT_BYTES
    disk = (retained + slack) * rf / inputs.disk_fill
    brokers_disk = math.ceil(disk / inputs.disk_per_broker_bytes - 1e-9)
    brokers_writes = math.ceil(
        peak_bytes * (1 + inputs.retry_fraction) * rf / inputs.broker_write_bytes_per_s - 1e-9)
    brokers = max(rf, brokers_disk, brokers_writes)

    dedup = _dedup(inputs, avg, peak, processes)
    return Plan(
        inputs=inputs, average_per_s=avg, peak_per_s=peak, peak_bytes_per_s=peak_bytes,
        backlog_jobs=backlog, backlog_bytes=backlog * inputs.job_bytes,
        catch_up_per_s=catch_up,
        retention_covers_outage=inputs.retention_s > inputs.outage_s + inputs.catch_up_s,
        per_process=per_process,
        processes_noop_peak=processes_for(peak, inputs.noop_per_process),
        processes_once_peak=processes_for(peak, inputs.once_per_process),
        processes_catch_up=processes_catch_up, processes=processes, partitions=partitions,
        retained_bytes=retained, segment_slack_bytes=slack, disk_bytes=disk,
        brokers_for_disk=brokers_disk, brokers_for_writes=brokers_writes, brokers=brokers,
        dedup_rows_peak_per_s=dedup.rows_peak, dedup_batch=dedup.batch,
        dedup_commits_peak_per_s=dedup.commits, dedup_deletes_per_s=dedup.deletes,
        dedup_rows_kept=dedup.rows_kept, dedup_table_bytes=dedup.table, limits=dedup.limits,
    )


class _Dedup(NamedTuple):
    rows_peak: float
    batch: float
    commits: float
    deletes: float
    rows_kept: float
    table: float
    limits: tuple[Limit, ...]


def _dedup(inputs: Inputs, avg: float, peak: float, processes: int) -> _Dedup:
    """The dedup table's load at `peak` over `processes`, and Postgres's limits."""
    rows_peak = peak * inputs.once_fraction
    batch = batch_size(rows_peak / processes, inputs.dedup_linger_ms, inputs.dedup_batch_max)
    commits = rows_peak / batch
    keep_s = inputs.dedup_keep_s if inputs.dedup_keep_s is not None else inputs.retention_s
    # Deleting rows is as much work for Postgres as inserting them; dropping a partition
    # is one statement a day.
    deletes = avg * inputs.once_fraction if inputs.prune == "delete" else 0.0
    rows_kept = avg * inputs.once_fraction * keep_s
    table = rows_kept * inputs.dedup_row_bytes
    limits = (
        Limit("postgres: dedup rows written", rows_peak + deletes, inputs.pg_rows_per_s,
              "rows/s", "a dedup database per group of types; drop partitions, "
              "not DELETE"),
        Limit("postgres: commits", commits, inputs.pg_commits_per_s, "commits/s",
              "a longer STREAM_JOBS_DEDUP_LINGER_MS: more jobs per commit"),
        Limit("postgres: dedup table on disk", table, inputs.pg_disk_bytes, "bytes",
              "keep rows for less time: a shorter lane retention, then prune"),
    )
    return _Dedup(rows_peak, batch, commits, deletes, rows_kept, table, limits)


__all__ = [
    "SECONDS_PER_DAY",
    "Inputs",
    "Limit",
    "Plan",
    "average_per_s",
    "batch_size",
    "blended_per_process",
    "plan",
    "processes_for",
    "round_partitions",
]
