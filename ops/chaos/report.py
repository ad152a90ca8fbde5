"""RESULTS.md: every run of every scenario, the method, and the machine it ran on.

Runs are kept in `out/results.json`; a run of some scenarios only (CHAOS_ONLY) replaces
those scenarios' rows and keeps the others', each row saying when it ran.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from ops.chaos import batches, failover
from ops.chaos.failover import FailoverResult
from ops.chaos.scenarios import SCENARIOS
from ops.chaos.trial import TrialResult

METHOD = """\
## Method

Each run gets a fresh topic prefix (so fresh topics and consumer groups) and Postgres
schema. The job type `chaos.work` has 6 partitions, delay tiers 1s/5s/10s and 8 attempts
(so a job failing through a 30 s outage is retried rather than dead-lettered). N jobs
are enqueued (acks=all, job IDs of our own; a chunk whose write failed is sent again
with the same IDs) while 3 real `stream-jobs worker ops.chaos.app:app` processes run;
most scenarios spread the enqueue over the time their faults take, so the faults hit a
group that is working, not one that has drained. Faults start once a tenth of the jobs
have their effect. Afterwards the runner waits until every job has its effect or a
dead letter and both groups (`.worker` on the lane, `.relay` on the tiers) have
committed up to the end offsets, then judges the run from:

- **Postgres**: `chaos_effects`, written by the handler inside the dedup transaction
  (odd jobs through `ctx.once_deferred()`, even ones through `ctx.once()`); it has no
  unique constraint, so a second effect for a job ID is a row.
- **the workers' delivery logs**: one line per handler call, appended (O_APPEND, one
  write) before anything else, outside any transaction; a line survives kill -9.
- **Kafka**: the lane, tier and DLQ records, and the groups' committed and end offsets.

Columns:

- **lost**: enqueued (acknowledged) jobs with no effect and no dead letter. Also checked:
  every acknowledged job ID is in the lane topic.
- **dup effects**: effect rows beyond one per job ID.
- **dup deliveries**: handler calls beyond one per (job ID, attempt). Expected after
  kill -9, SIGSTOP, broker faults and rebalances (the dedup row makes them harmless);
  the goal for a clean rolling restart is 0.
- **commits past unfinished**: the worker group's committed offsets are sampled every
  0.5 s during the run; every lane record below a sampled offset must have finished
  before that sample (its effect row was inserted, or its failed attempt's tier/DLQ
  record was written, by that record's producer timestamp). The effect row's time is
  its insert, a moment before its COMMIT, so this errs by that moment towards passing.
  At the end, committed = end offsets on every lane and tier partition, and every job a
  killed or paused worker had started without finishing was delivered again later
  (`in flight at faults / not redelivered`).
- **recovery s**: per fault, seconds from its healing (the kill, the SIGCONT, the broker
  or Postgres back) until effects/s over the last 2 s (at least 1 s) is back to half
  the rate of the 5 s before the first fault, or the backlog is drained; the median and
  the worst of the run. With a paced enqueue that rate is the enqueue rate. During a
  storm or a series of kills, later faults land before earlier ones have recovered, so
  those figures are "until the storm is over". **drain s**: from the last fault's
  healing to the last effect. **jobs/s**: effects per second over the whole run.
"""


class MetaJSON(TypedDict):
    """The invocation that wrote RESULTS.md."""

    date: str
    commit: str  # the code that ran: `git rev-parse --short HEAD`, "+ changes" if dirty
    jobs: int
    runs: int
    minutes: float
    machine: str
    n_note: str  # empty when N is at least the 100,000


class RunJSON(TypedDict):
    """One run as results.json keeps it and RESULTS.md is rendered from."""

    scenario: str
    run: int
    seconds: float
    started: float  # epoch seconds
    notes: list[str]
    ok: bool
    # dataclasses.asdict of the Verdict and of each Fault (asdict's type is dict[str, Any]).
    verdict: dict[str, Any]
    faults: list[dict[str, Any]]


class FailoverRowJSON(TypedDict):
    """One run of the scheduler failover scenario, as results.json keeps it."""

    run: int
    started: float  # epoch seconds
    seconds: float
    window_s: float
    lease_s: float
    ok: bool
    firings: int
    missed: int
    duplicate_effects: int
    enqueued_twice: int
    duplicate_outcomes: int
    faults: list[str]
    takeovers_s: list[float | None]
    gaps_s: list[float]
    late_ms: list[float | None]  # p50, p99, max
    problems: list[str]


def failover_row(result: FailoverResult) -> FailoverRowJSON:
    v = result.verdict
    return {"run": result.run, "started": result.started, "seconds": result.seconds,
            "window_s": result.window_s, "lease_s": result.lease_s, "ok": v.ok,
            "firings": v.firings, "missed": len(v.missed),
            "duplicate_effects": v.duplicate_effects, "enqueued_twice": v.enqueued_twice,
            "duplicate_outcomes": v.duplicate_outcomes,
            "faults": [f.kind for f in result.faults], "takeovers_s": v.takeovers_s,
            "gaps_s": v.gaps_s, "late_ms": [v.late(50), v.late(99), v.late(100)],
            "problems": [*v.problems, *result.notes]}


def _each(values: list[float | None], kinds: list[str], kind: str) -> str:
    picked = [v for v, k in zip(values, kinds, strict=False) if k == kind]
    return ", ".join(_fmt(v) if v is None else f"{v:.2f}" for v in picked) or "-"


def failover_section(rows: list[FailoverRowJSON]) -> list[str]:
    """The `## Scheduler failover` section: one line per run, and how it is judged."""
    lines = ["## Scheduler failover", "", f"**{failover.SCENARIO}** ({failover.TITLE}): "
             f"{failover.METHOD}", "",
             "| run | when (UTC) | window s | firings | missed | dup effects | enqueued "
             "twice / duplicate outcomes | takeover s after kill -9 | takeover s after "
             "SIGSTOP (lease) | failover gap s after kill -9 | failover gap s after SIGSTOP | "
             "firing late ms p50 / p99 / max | run s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        when = datetime.fromtimestamp(r["started"], UTC).strftime("%m-%d %H:%M")
        gaps: list[float | None] = list(r["gaps_s"])
        late = " / ".join(_fmt(v) for v in r["late_ms"])
        lines.append(
            f"| {r['run']} | {when} | {r['window_s']:.0f} | {r['firings']} | {r['missed']} | "
            f"{r['duplicate_effects']} | {r['enqueued_twice']} / {r['duplicate_outcomes']} | "
            f"{_each(r['takeovers_s'], r['faults'], 'kill -9')} | "
            f"{_each(r['takeovers_s'], r['faults'], 'SIGSTOP')} ({r['lease_s']:.0f}) | "
            f"{_each(gaps, r['faults'], 'kill -9')} | {_each(gaps, r['faults'], 'SIGSTOP')} | "
            f"{late} | {r['seconds']:.0f} |")
    problems = [(r["run"], p) for r in rows for p in r["problems"]]
    if problems:
        lines += ["", *[f"- {failover.SCENARIO} run {n}: {p}" for n, p in problems]]
    lines += ["", "The failover gap is the time from a fault to the next firing any "
              "scheduler enqueued; with a 1 s schedule it includes the wait for the next "
              "fire time (up to 1 s). After kill -9 the lock is free as soon as Postgres "
              "sees the socket close, and the waiting scheduler, blocked in "
              "`pg_advisory_lock`, has it at once; after SIGSTOP the frozen leader's "
              "socket stays open, so the lock is released when its session has been idle "
              "for the lease (`idle_session_timeout`), and the firings due meanwhile run "
              "late, not missed (a firing up to 30 s overdue always runs).", ""]
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def row(result: TrialResult) -> RunJSON:
    """A run as JSON (what results.json keeps and RESULTS.md is rendered from)."""
    return {"scenario": result.scenario, "run": result.run, "seconds": result.seconds,
            "started": result.started, "notes": result.notes, "ok": result.verdict.ok,
            "verdict": asdict(result.verdict), "faults": [asdict(f) for f in result.faults]}


def _ok(r: RunJSON) -> bool:
    return bool(r["ok"]) and not (SCENARIOS[r["scenario"]].no_redelivery
                                  and r["verdict"]["duplicate_deliveries"])


def render(rows: list[RunJSON], meta: MetaJSON,
           failover_rows: list[FailoverRowJSON] | None = None,
           batch_rows: list[dict[str, Any]] | None = None) -> str:
    lines = [
        "# Fault injection results",
        "",
        f"`make chaos` ({meta['date']}, commit {meta.get('commit') or 'unknown'}): "
        f"N = {meta['jobs']:,} jobs per run, "
        f"{meta['runs']} runs per scenario, {meta['minutes']:.0f} min for the invocation "
        "that wrote this file.",
        "",
        f"**Machine caveat.** {meta['machine']}. Kafka, Postgres, the workers and the "
        "runner share it, and other work ran on it at the same time, so throughput and "
        "recovery times are this machine's at that moment, not the system's; the counts "
        "(lost, duplicate effects) do not depend on it.",
        "",
    ]
    if meta.get("n_note"):
        lines += [meta["n_note"], ""]
    ok = (all(r["ok"] for r in rows) and all(r["ok"] for r in failover_rows or [])
          and all(r["ok"] for r in batch_rows or []))
    lines += [
        f"**Verdict: {'0 lost and 0 duplicate effects in every run' if ok else 'PROBLEMS FOUND'}"
        "**" + ("." if ok else " (see the problems below)."),
        "",
        "| scenario | run | when (UTC) | N | lost | dup effects | dup deliveries | "
        "dead-lettered | commits past unfinished | in flight at faults / not redelivered | "
        "faults | recovery s (median / max) | drain s | jobs/s | run s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        v = r["verdict"]
        rec = v["recovery_s"]
        median = statistics.median(rec) if rec else None
        worst = max(rec) if rec else None
        when = datetime.fromtimestamp(r["started"], UTC).strftime("%m-%d %H:%M")
        lines.append(
            f"| {r['scenario']} | {r['run']} | {when} | {v['jobs']:,} | {v['lost']} | "
            f"{v['duplicate_effects']} | {v['duplicate_deliveries']:,} | "
            f"{v['dead_lettered']} | {v['commits_past_unfinished']} | "
            f"{v['in_flight_at_faults']} / {v['not_redelivered']} | {v['faults']} | "
            f"{_fmt(median)} / {_fmt(worst)} | {_fmt(v['drain_s'])} | "
            f"{_fmt(v.get('rate_per_s'))} | {r['seconds']:.0f} |")
    problems = [(r, p) for r in rows for p in [*r["verdict"]["problems"], *r["notes"]]]
    if problems:
        lines += ["", "## Problems and notes", ""]
        lines += [f"- {r['scenario']} run {r['run']}: {p}" for r, p in problems]
    lines += ["", "## Scenarios", ""]
    for name in dict.fromkeys(r["scenario"] for r in rows):
        s = SCENARIOS[name]
        lines.append(f"- **{name}** ({s.title}): {s.method}")
    if failover_rows:
        lines += ["", *failover_section(failover_rows)]
    if batch_rows:
        lines += ["", *batches.batch_section(batch_rows)]
    lines += ["", METHOD]
    return "\n".join(lines) + "\n"


def commit() -> str:
    """The commit the run's code is at, and whether the tree had changes beside it."""
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return f"{head} + changes" if dirty else head


def machine() -> str:
    cores = os.cpu_count() or 0
    try:
        mem_kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal")).split()[1])
        mem = f", {mem_kb / 1024 / 1024:.1f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        mem = ""
    return f"{cores} cores{mem}, {platform.system()} {platform.release()}, Python " \
           f"{platform.python_version()}"


def merged(previous: Path, fresh: list[RunJSON]) -> list[RunJSON]:
    """The rows of `previous` (results.json) for scenarios not in `fresh`, then `fresh`,
    in the scenarios' order."""
    ran = {r["scenario"] for r in fresh}
    kept: list[RunJSON] = []
    if previous.is_file():
        try:
            kept = [r for r in json.loads(previous.read_text())["runs"]
                    if r["scenario"] not in ran and r["scenario"] in SCENARIOS
                    and "ok" in r]
        except (ValueError, KeyError):
            kept = []
    order = list(SCENARIOS)
    return sorted([*kept, *fresh], key=lambda r: (order.index(r["scenario"]), r["run"]))


def merged_failover(previous: Path, fresh: list[FailoverRowJSON]) -> list[FailoverRowJSON]:
    """This invocation's failover runs, or the previous invocation's when it ran none."""
    if fresh or not previous.is_file():
        return fresh
    try:
        kept: list[FailoverRowJSON] = json.loads(previous.read_text()).get("failover", [])
    except ValueError:
        return []
    return kept


def merged_batch(previous: Path, fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This invocation's batch runs, or the previous invocation's when it ran none."""
    if fresh or not previous.is_file():
        return fresh
    try:
        kept: list[dict[str, Any]] = json.loads(previous.read_text()).get("batch", [])
    except ValueError:
        return []
    return kept


def write(path: Path, rows: list[RunJSON], meta: MetaJSON,
          failover_rows: list[FailoverRowJSON] | None = None,
          batch_rows: list[dict[str, Any]] | None = None) -> None:
    path.write_text(render(rows, meta, failover_rows, batch_rows))
    out = path.parent / "out"
    out.mkdir(exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "runs": rows, "failover": failover_rows or [],
         "batch": batch_rows or []}, indent=2) + "\n")


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
