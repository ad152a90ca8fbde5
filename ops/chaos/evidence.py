"""What a run leaves behind, as plain data: the facts the checks judge.

Collected from Postgres (effects), the workers' delivery logs, Kafka (the lanes, the
delay tiers, the DLQ, committed and end offsets) and the samplers that ran during the
run (throughput, committed offsets over time). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Delivery:
    """One handler call, from a worker's delivery log (written outside any transaction)."""

    job_id: str
    attempt: int
    partition: int
    offset: int
    pid: int
    at: float  # epoch seconds


@dataclass(frozen=True, slots=True)
class Effect:
    """One row of the effects table (written inside the `ctx.once()` transaction)."""

    job_id: str
    pid: int
    partition: int
    offset: int
    attempt: int
    at: float  # epoch seconds of the insert (the transaction commits a moment later)


@dataclass(frozen=True, slots=True)
class LaneRecord:
    """A record of the lane topic: which job (and attempt) sits at a partition offset."""

    partition: int
    offset: int
    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A record the workers wrote to a delay tier or the DLQ for a failed attempt."""

    job_id: str
    attempt: int  # the attempt it carries (a retry is the failed attempt + 1)
    at: float  # epoch seconds: the producer's timestamp, taken when the write was sent
    dead_letter: bool


@dataclass(frozen=True, slots=True)
class CommitSample:
    """The worker group's committed offsets of the lane, read at `at` (epoch seconds)."""

    at: float
    offsets: dict[int, int]


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault: when it began, when it was healed, and what it was."""

    kind: str
    started: float
    healed: float
    detail: str = ""
    # Worker processes the fault hit (killed or paused): their unfinished jobs must run again.
    pids: tuple[int, ...] = ()


@dataclass
class Evidence:
    """Everything one run produced."""

    enqueued: list[str]
    lane: list[LaneRecord]
    effects: list[Effect]
    deliveries: list[Delivery]
    forwarded: list[Forwarded]
    commit_samples: list[CommitSample]
    final_committed: dict[int, int]
    lane_ends: dict[int, int]
    relay_committed: dict[tuple[str, int], int]
    tier_ends: dict[tuple[str, int], int]
    throughput: list[tuple[float, int]]  # (epoch s, effect rows so far)
    faults: list[Fault]
    expected_failures: set[str] = field(default_factory=set)  # fail_first job IDs
    rss_peak_mb: float | None = None  # the highest resident memory of any worker
