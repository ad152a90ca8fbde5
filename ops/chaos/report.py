"""RESULTS.md: every run of every scenario and trial, the method, and the machine it ran on.

Runs are kept in `out/results.json`; a run of some scenarios only (CHAOS_ONLY) replaces
those scenarios' rows and keeps the others', each row saying when it ran.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ops.chaos.protocol import OwnTrial, TrialRow, section
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
    commit: NotRequired[str]  # the commit the run measured (absent in older files)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _rss(v: dict[str, Any]) -> str:
    """The peak, and its ratio to the network baseline's where the scenario has a goal."""
    peak = v.get("rss_peak_mb")
    if peak is None:
        return "-"
    ratio = v.get("rss_ratio")
    return f"{peak:.0f}" + (f" ({ratio:.2f}x baseline)" if ratio is not None else "")


def row(result: TrialResult) -> RunJSON:
    """A run as JSON (what results.json keeps and RESULTS.md is rendered from)."""
    return {"scenario": result.scenario, "run": result.run, "seconds": result.seconds,
            "started": result.started, "notes": result.notes, "ok": result.verdict.ok,
            "verdict": asdict(result.verdict), "faults": [asdict(f) for f in result.faults],
            "commit": commit()}


def _commits(rows: Sequence[Mapping[str, Any]],
             trials: Sequence[tuple[OwnTrial, list[TrialRow]]]) -> str:
    """Which commit each scenario's and trial's runs measured (a CHAOS_ONLY invocation
    keeps the other rows of the one before)."""
    by: dict[str, list[str]] = {}
    named: list[tuple[str, Mapping[str, Any]]] = [(r["scenario"], r) for r in rows]
    named += [(t.name, r) for t, runs in trials for r in runs]
    for name, r in named:
        names = by.setdefault(r.get("commit") or "unknown", [])
        if name not in names:
            names.append(name)
    return "The runs' commits: " + "; ".join(
        f"{c}: {', '.join(names)}" for c, names in by.items()) + "."


def _process_table(rows: list[RunJSON]) -> list[str]:
    """The process-fault scenarios: a line per run, the problems, what each scenario does."""
    lines = [
        "| scenario | run | when (UTC) | N | lost | dup effects | dup deliveries | "
        "dead-lettered | commits past unfinished | in flight at faults / not redelivered | "
        "faults | recovery s (median / max) | drain s | jobs/s | worker RSS MB (peak) | "
        "run s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
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
            f"{_fmt(v.get('rate_per_s'))} | {_rss(v)} | {r['seconds']:.0f} |")
    problems = [(r, p) for r in rows for p in [*r["verdict"]["problems"], *r["notes"]]]
    if problems:
        lines += ["", "## Problems and notes", ""]
        lines += [f"- {r['scenario']} run {r['run']}: {p}" for r, p in problems]
    lines += ["", "## Scenarios", ""]
    for name in dict.fromkeys(r["scenario"] for r in rows):
        s = SCENARIOS[name]
        lines.append(f"- **{name}** ({s.title}): {s.description}")
    return lines


def render(rows: list[RunJSON], meta: MetaJSON,
           trials: Sequence[tuple[OwnTrial, list[TrialRow]]] = ()) -> str:
    """The whole file: the invocation, the machine, the verdict, the process-fault table,
    a section per trial that has runs, and the method."""
    lines = [
        "# Fault injection results",
        "",
        f"`make chaos` ({meta['date']}, commit {meta.get('commit') or 'unknown'}): "
        f"N = {meta['jobs']:,} jobs per run, "
        f"{meta['runs']} run{'' if meta['runs'] == 1 else 's'} per scenario, "
        f"{meta['minutes']:.0f} min for the invocation "
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
    lines += [_commits(rows, trials), ""]
    ok = all(r["ok"] for r in rows) and all(r["ok"] for _, runs in trials for r in runs)
    lines.append(
        f"**Verdict: {'0 lost and 0 duplicate effects in every run' if ok else 'PROBLEMS FOUND'}"
        "**" + ("." if ok else " (see the problems below)."))
    if rows:
        lines += ["", *_process_table(rows)]
    for trial, runs in trials:
        if runs:
            lines += ["", *section(trial, runs)]
    lines += ["", METHOD]
    return "\n".join(lines) + "\n"


def commit() -> str:
    """The commit the run's code is at, and whether the tree had changes beside it."""
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                  "--untracked-files=no"],
                                 capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    # The results pages this very invocation rewrites are not a change to what it runs.
    dirty = [line for line in changed.splitlines()
             if not line[3:].startswith("ops/chaos/RESULTS")]
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


def merged_trials(previous: Path, fresh: dict[str, list[TrialRow]],
                  trials: Sequence[OwnTrial]) -> list[tuple[OwnTrial, list[TrialRow]]]:
    """Each trial with this invocation's runs, or the previous invocation's when it ran
    none."""
    kept: dict[str, list[TrialRow]] = {}
    if previous.is_file():
        try:
            kept = json.loads(previous.read_text()).get("trials", {})
        except ValueError:
            kept = {}
    return [(t, fresh.get(t.name) or kept.get(t.name, [])) for t in trials]


FULL_N = 100_000  # the jobs per run: such an invocation has files of its own


def files(jobs: int) -> tuple[str, str]:
    """(the page, the runs kept under out/) of an invocation with `jobs` per run: the
    runs at the full N are kept apart from the usual ones."""
    if jobs >= FULL_N:
        return "RESULTS-100k.md", "results-100k.json"
    return "RESULTS.md", "results.json"


def write(path: Path, rows: list[RunJSON], meta: MetaJSON,
          trials: Sequence[tuple[OwnTrial, list[TrialRow]]] = (), *,
          kept: str = "results.json") -> None:
    path.write_text(render(rows, meta, trials))
    out = path.parent / "out"
    out.mkdir(exist_ok=True)
    (out / kept).write_text(json.dumps(
        {"meta": meta, "runs": rows, "trials": {t.name: runs for t, runs in trials}},
        indent=2) + "\n")


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
