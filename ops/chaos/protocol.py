"""The protocol of the trials with a procedure of their own (batches, cancels, failover,
outbox), beside the process-fault scenarios that share one (`trial.py`): how the runner
(`python -m ops.chaos.run`) runs one, logs each run, keeps it in results.json and writes
its section of RESULTS.md.

A trial module declares `TRIAL = OwnTrial(...)`. Each run comes back as a row, a JSON
object with `run`, `started` (epoch seconds), `seconds`, `ok`, `problems` (the
checker's findings, or what stopped the run: `ok` is their absence) and `notes` (what
else is worth a look, no verdict), beside the trial's own counts.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ops.chaos.trial import Stack

TrialRow = dict[str, Any]


@dataclass(frozen=True)
class OwnTrial:
    """A trial, how to run it once, and how its runs read in RESULTS.md."""

    name: str  # CHAOS_ONLY's name for it
    heading: str  # its section of RESULTS.md
    title: str
    method: str
    # One run: (the stack, the runs' folder, the run's number, CHAOS_JOBS or None for the
    # trial's own size) -> its row.
    run: Callable[[Stack, Path, int, int | None], Awaitable[TrialRow]]
    columns: tuple[str, ...]  # the section's table, after `run`
    cells: Callable[[TrialRow], list[str]]
    summary: Callable[[TrialRow], str]  # a run in one line of the runner's log
    notes: str = ""  # how to read the table, after it
    # What its runs in the other stages add, by stage (CLUSTER: leader kills on the 3-node
    # cluster, `leaders.py`; NETWORK: the workers' Postgres link cut, `pg_link.py`): the
    # runner runs `elsewhere(trial, stage)` in each of those stages too.
    elsewhere: Mapping[str, str] = field(default_factory=dict)
    stage: str = "single"  # the runner's stage this one runs in


CLUSTER, NETWORK = "cluster", "network"
# Per stage: the suffix of a trial's name there, and the column (and row key) its extra
# faults are counted in.
_STAGED = {CLUSTER: ("@cluster", "leader kill -9", "leader_kills", "on the 3-node cluster"),
           NETWORK: ("@net", "Postgres link cut", "link_faults",
                     "through Toxiproxy")}


def elsewhere(trial: OwnTrial, stage: str) -> OwnTrial:
    """`trial` as the runner's `stage` runs it (`<name>@cluster`, `<name>@net`: a section
    of RESULTS.md of its own), its extra faults counted in a column of their own."""
    if stage not in trial.elsewhere or stage not in _STAGED:
        raise ValueError(f"the {trial.name} trial has no run in the {stage} stage")
    suffix, column, key, where = _STAGED[stage]

    def cells(r: TrialRow) -> list[str]:
        return [str(r.get(key, 0)), *trial.cells(r)]

    def summary(r: TrialRow) -> str:
        return f"{trial.summary(r)}, {r.get(key, 0)} {column}"

    return replace(trial, name=trial.name + suffix, heading=f"{trial.heading}, {where}",
                   title=f"{trial.title}, {where}",
                   method=f"{trial.method} {where.capitalize()}: {trial.elsewhere[stage]}",
                   columns=(column, *trial.columns), cells=cells, summary=summary,
                   elsewhere={}, stage=stage)


def row(run: int, started: float, problems: list[str], notes: Sequence[str] = (), /,
        **counts: Any) -> TrialRow:
    """A run's row: `seconds` is from `started` until now."""
    return {"run": run, "started": started, "seconds": round(time.time() - started, 1),
            "ok": not problems, "problems": problems, "notes": list(notes), **counts}


def section(trial: OwnTrial, rows: list[TrialRow]) -> list[str]:
    """The trial's `## heading` of RESULTS.md: what it does, its verdict, a line per run,
    the problems found."""
    bad = [r["run"] for r in rows if not r["ok"]]
    verdict = (f"every run passed its checks ({len(rows)} of {len(rows)})" if not bad else
               "PROBLEMS in run " + ", ".join(map(str, bad)) + " (see below)")
    lines = [f"## {trial.heading}", "", f"**{trial.name}** ({trial.title}): {trial.method}",
             "", f"**Verdict: {verdict}.**", "",
             "| run | " + " | ".join(trial.columns) + " |",
             "|---|" + "---|" * len(trial.columns)]
    lines += ["| " + " | ".join([str(r["run"]), *trial.cells(r)]) + " |" for r in rows]
    problems = [(r["run"], p) for r in rows for p in [*r["problems"], *r["notes"]]]
    if problems:
        lines += ["", *[f"- {trial.name} run {n}: {p}" for n, p in problems]]
    if trial.notes:
        lines += ["", trial.notes]
    return lines
