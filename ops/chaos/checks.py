"""The verdict on one run, computed from its evidence. Pure: no Kafka, no Postgres.

- lost: an enqueued job with no effect and no dead letter (`unlogged`: an acknowledged
  enqueue that the lane topic does not hold at all, which would be Kafka's loss);
- duplicate effects: effect rows beyond one per job ID (the table has no unique key);
- duplicate deliveries: handler calls beyond one per (job ID, attempt);
- commits past unfinished work, two ways: (1) every committed offset sampled during the
  run covers only lane records finished before the sample (an effect inserted, or the
  failed attempt's tier/DLQ record written); (2) at the end the group's committed offsets
  equal the lane's end offsets (and the relay's equal the tiers'), and every job a killed
  or paused worker had started without finishing was delivered again afterwards;
- recovery: seconds from a fault's healing until throughput is back to half the rate
  before the first fault (or the backlog is drained).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ops.chaos.evidence import Evidence, Fault

RATE_WINDOW_S = 2.0
RECOVERED_FRACTION = 0.5
MIN_WINDOW_S = 1.0


@dataclass
class Verdict:
    """The figures of one run; `ok` is the goal: nothing lost, no effect twice, no commit
    past unfinished work."""

    jobs: int
    lost: int
    unlogged: int
    duplicate_effects: int
    duplicate_deliveries: int
    dead_lettered: int
    commits_past_unfinished: int
    unfinished_at_end: int
    not_redelivered: int
    in_flight_at_faults: int
    faults: int
    recovery_s: list[float]
    drain_s: float | None
    rate_per_s: float | None = None
    problems: list[str] = field(default_factory=list)
    rss_peak_mb: float | None = None
    # Set by the runner for a scenario with a memory goal (net-bandwidth): its peak over
    # the network baseline's, and whether that is over the goal.
    rss_ratio: float | None = None
    memory_over_goal: bool = False

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.unlogged == 0 and self.duplicate_effects == 0
                and self.commits_past_unfinished == 0 and self.unfinished_at_end == 0
                and self.not_redelivered == 0 and not self.memory_over_goal)

    @property
    def recovery_max_s(self) -> float | None:
        return max(self.recovery_s) if self.recovery_s else None

    @property
    def recovery_median_s(self) -> float | None:
        return statistics.median(self.recovery_s) if self.recovery_s else None


def judge(ev: Evidence) -> Verdict:
    problems: list[str] = []
    enqueued = set(ev.enqueued)
    effect_counts = Counter(e.job_id for e in ev.effects)
    dead = {f.job_id for f in ev.forwarded if f.dead_letter}

    lost_ids = sorted(j for j in enqueued if j not in effect_counts and j not in dead)
    if lost_ids:
        problems.append(f"{len(lost_ids)} jobs lost, e.g. {lost_ids[:3]}")
    in_lane = {r.job_id for r in ev.lane}
    unlogged = sorted(enqueued - in_lane)
    if unlogged:
        problems.append(f"{len(unlogged)} acknowledged enqueues missing from the lane topic, "
                        f"e.g. {unlogged[:3]}")
    strangers = set(effect_counts) - enqueued
    if strangers:
        problems.append(f"effects for job IDs never enqueued: {sorted(strangers)[:3]}")
    doubled = {j: n for j, n in effect_counts.items() if n > 1}
    if doubled:
        problems.append(f"{len(doubled)} jobs with duplicate effects, e.g. "
                        f"{list(doubled.items())[:3]}")
    duplicate_effects = sum(n - 1 for n in doubled.values())

    per_attempt = Counter((d.job_id, d.attempt) for d in ev.deliveries)
    duplicate_deliveries = sum(n - 1 for n in per_attempt.values() if n > 1)

    past = commits_past_unfinished(ev)
    if past:
        problems.append(f"{len(past)} lane records committed before they finished, e.g. "
                        f"{past[:3]}")
    unfinished = unfinished_at_end(ev)
    problems += unfinished
    in_flight, not_again = redelivered_after_faults(ev)
    if not_again:
        problems.append(f"{len(not_again)} jobs in flight on a faulted worker were never "
                        f"delivered again, e.g. {not_again[:3]}")
    recovery = recovery_times(ev.throughput, ev.faults, total=len(enqueued) - len(dead))
    drain = drain_time(ev.throughput, ev.faults, total=len(enqueued) - len(dead))
    return Verdict(
        jobs=len(enqueued), lost=len(lost_ids), unlogged=len(unlogged),
        duplicate_effects=duplicate_effects, duplicate_deliveries=duplicate_deliveries,
        dead_lettered=len(dead & enqueued), commits_past_unfinished=len(past),
        unfinished_at_end=len(unfinished), not_redelivered=len(not_again),
        in_flight_at_faults=in_flight, faults=len(ev.faults), recovery_s=recovery,
        drain_s=drain, rate_per_s=overall_rate(ev.throughput), problems=problems,
        rss_peak_mb=ev.rss_peak_mb)


def commits_past_unfinished(ev: Evidence) -> list[tuple[int, int, str]]:
    """Lane records (partition, offset, job) below a sampled committed offset that had not
    finished by the time of the sample.

    Finished means: an effect row of the job was inserted, or a tier/DLQ record of this
    attempt's failure was written (this attempt + 1 for a retry, this attempt for a dead
    letter). The effect's time is its insert, a moment before its COMMIT, so the check
    errs towards passing by that moment; it never flags work that had finished.
    """
    first_effect: dict[str, float] = {}
    for e in ev.effects:
        first_effect[e.job_id] = min(e.at, first_effect.get(e.job_id, e.at))
    forwarded_at: dict[tuple[str, int], float] = {}
    for f in ev.forwarded:
        failed_attempt = f.attempt if f.dead_letter else f.attempt - 1
        key = (f.job_id, failed_attempt)
        forwarded_at[key] = min(f.at, forwarded_at.get(key, f.at))
    by_partition: dict[int, list[tuple[int, str, int]]] = defaultdict(list)
    for r in ev.lane:
        by_partition[r.partition].append((r.offset, r.job_id, r.attempt))
    for records in by_partition.values():
        records.sort()
    checked: dict[int, int] = defaultdict(int)  # index into by_partition[p] checked so far
    flagged: list[tuple[int, int, str]] = []
    for sample in sorted(ev.commit_samples, key=lambda s: s.at):
        for partition, committed in sample.offsets.items():
            records = by_partition.get(partition, [])
            i = checked[partition]
            while i < len(records) and records[i][0] < committed:
                offset, job_id, attempt = records[i]
                done_at = min(first_effect.get(job_id, float("inf")),
                              forwarded_at.get((job_id, attempt), float("inf")))
                if done_at > sample.at:
                    flagged.append((partition, offset, job_id))
                i += 1
            checked[partition] = i
    return flagged


def unfinished_at_end(ev: Evidence) -> list[str]:
    """Partitions whose committed offset is not their end offset once the run drained."""
    problems = []
    for partition, end in sorted(ev.lane_ends.items()):
        committed = ev.final_committed.get(partition, 0)
        if committed != end:
            problems.append(f"lane partition {partition}: committed {committed}, end {end}")
    for tp, end in sorted(ev.tier_ends.items()):
        committed = ev.relay_committed.get(tp, 0)
        if committed != end:
            problems.append(f"tier {tp[0]} partition {tp[1]}: committed {committed}, "
                            f"end {end}")
    return problems


def redelivered_after_faults(ev: Evidence) -> tuple[int, list[str]]:
    """(jobs a faulted worker had started and not finished, those never delivered again).

    A delivery to a killed or paused worker was in flight if that process wrote no effect
    for the job, the job was not failing on purpose (its retry is checked by
    `commits_past_unfinished`), and no other process that started the job earlier wrote
    its effect (then this delivery was a duplicate, acknowledged without running). Such a
    job must be delivered again, to another process, after that delivery began.
    """
    faulted = {pid for f in ev.faults for pid in f.pids}
    if not faulted:
        return 0, []
    finished_by = {(e.job_id, e.pid) for e in ev.effects}
    first_start: dict[tuple[str, int], float] = {}
    runs: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for d in ev.deliveries:
        key = (d.job_id, d.pid)
        first_start[key] = min(d.at, first_start.get(key, d.at))
        runs[d.job_id].append((d.at, d.pid))
    in_flight = 0
    missing: list[str] = []
    for d in ev.deliveries:
        if d.pid not in faulted or (d.job_id, d.pid) in finished_by:
            continue
        if d.job_id in ev.expected_failures and d.attempt == 1:
            continue
        done_before = any(pid != d.pid and (d.job_id, pid) in finished_by
                          and first_start[(d.job_id, pid)] < d.at
                          for _, pid in runs[d.job_id])
        if done_before:
            continue
        in_flight += 1
        if not any(at > d.at and pid != d.pid for at, pid in runs[d.job_id]):
            missing.append(d.job_id)
    return in_flight, missing


def rate_between(series: list[tuple[float, int]], start: float, end: float) -> float | None:
    """Effects per second between two times, from the samples nearest inside them."""
    inside = [(t, n) for t, n in series if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def recovery_times(series: list[tuple[float, int]], faults: list[Fault], *,
                   total: int) -> list[float]:
    """Per fault, seconds from its healing until the rate over the last RATE_WINDOW_S is
    back to RECOVERED_FRACTION of the rate before the first fault, or all `total` jobs
    have their effect. A fault never recovered from within the series is left out."""
    if not faults or not series:
        return []
    first = min(f.started for f in faults)
    baseline = rate_between(series, first - 5.0, first)
    if baseline is None or baseline <= 0:
        baseline = rate_between(series, series[0][0], first)
    result = []
    for fault in faults:
        for t, n in series:
            if t < fault.healed:
                continue
            if n >= total:
                result.append(max(0.0, t - fault.healed))
                break
            if t - fault.healed < MIN_WINDOW_S:
                continue
            rate = rate_between(series, max(fault.healed, t - RATE_WINDOW_S), t)
            if rate is not None and baseline and rate >= RECOVERED_FRACTION * baseline:
                result.append(t - fault.healed)
                break
    return result


def overall_rate(series: list[tuple[float, int]]) -> float | None:
    """Effects per second from the first effect to the last, faults included."""
    active = [(t, n) for t, n in series if n > 0]
    if not active:
        return None
    last = next((t, n) for t, n in series if n >= active[-1][1])
    return rate_between(series, active[0][0] - 0.25, last[0])


def drain_time(series: list[tuple[float, int]], faults: list[Fault], *,
               total: int) -> float | None:
    """Seconds from the last fault's healing until every job had its effect."""
    if not faults:
        return None
    last = max(f.healed for f in faults)
    done = next((t for t, n in series if n >= total), None)
    return None if done is None else max(0.0, done - last)
