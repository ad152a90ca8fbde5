"""The processes section of the bench (`worker --processes 2` against 1): its figures'
goals, its part of RESULTS.md, and the CPU of a process tree. No services."""

from __future__ import annotations

import os
import time
from typing import Any

from ops.bench.common import Results
from ops.bench.cpu import process_cpu_s, tree_cpu_s
from ops.bench.processes import GOALS as PROCESSES_GOALS
from ops.bench.report import OWN_HEADINGS, render
from ops.bench.report.processes import processes_section
from ops.bench.report.summary import GOALS
from ops.bench.report.tables import goal_rows, goals_of
from ops.bench.scaling_app import stamp_files


def _run(processes: int, rate: float, repeat: int, workers: float) -> dict[str, Any]:
    return {"brokers": 1, "handler": "noop", "processes": processes, "repeat": repeat,
            "rate": rate, "first_to_last_rate": rate, "wall_s": 10.0,
            "supervisor_cpu_s": 0.02 if processes > 1 else 0.0,
            "cores": {"workers": workers, "brokers": 0.2, "postgres": 0.0, "machine": 1.9}}


def _results() -> Results:
    results = Results()
    runs = [_run(1, 10_000.0, 0, 0.9), _run(2, 17_000.0, 0, 1.6),
            _run(1, 12_000.0, 1, 1.0), _run(2, 16_000.0, 1, 1.7)]
    for count in (1, 2):
        mine = [r for r in runs if r["processes"] == count]
        results.add(f"processes.p{count}", f"p{count}", "jobs/s", [r["rate"] for r in mine])
        results.add(f"processes.p{count}_per_core", f"p{count}/core", "jobs/s/core",
                    [r["rate"] / r["cores"]["workers"] for r in mine])
    results.details["processes"] = {"runs": runs, "nproc": 2, "backlog": 60_000,
                                    "partitions": 12, "repeats": 2,
                                    "cpu_of": {"broker": True, "postgres": False}}
    return results


def test_the_goals_are_judged_from_the_paired_runs() -> None:
    figures = _results().to_json()["figures"]
    throughput, per_core = goal_rows(figures, goals_of(PROCESSES_GOALS))
    # Medians 16,500 / 11,000 = 1.50x: met; paired 1.70x and 1.33x: one run of two.
    assert throughput[1:4] == ["1.50x", "1.33x - 1.70x", "**MET**"]
    assert throughput[5] == "1/2"
    # Per worker core: medians 10,018 / 11,556 = 0.87x, under 0.9x.
    assert per_core[1:4] == ["0.87x", "0.78x - 0.96x", "**NOT MET**"]
    # The full run's Goals table has them.
    assert all(goal in GOALS for goal in goals_of(PROCESSES_GOALS))


def test_the_section_shows_the_split_and_what_was_not_measured() -> None:
    data = _results().to_json()
    text = "\n".join(processes_section(data["details"]["processes"], data["figures"]))
    assert text.startswith("## Worker processes\n")
    assert "| 2 | 1 | no-op | 16,500 |" in text
    assert "`--processes 2` / `--processes 1`: 1.50x" in text
    assert "The postgres CPU was not measured" in text
    assert "used 0.02 s of CPU over a 10 s drain, 0.2% of a core" in text


def test_a_partial_run_owns_the_section_and_a_failure_is_shown() -> None:
    assert OWN_HEADINGS["processes"] == "Worker processes"
    data = _results().to_json()
    data.update(meta={}, timings_s={}, errors={"processes": "BenchError: broker gone"})
    text = render(data)
    assert "## Worker processes" in text
    assert "**The processes run failed**: BenchError: broker gone" in text


def test_a_process_tree_counts_its_children_live_and_reaped(tmp_path: Any) -> None:
    pid = os.fork()
    if pid == 0:  # burn a little CPU, then wait to be reaped
        deadline = time.process_time() + 0.2
        while time.process_time() < deadline:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    # The child's 0.2 s is in this process's cutime now, not in its own time.
    assert tree_cpu_s(os.getpid()) >= process_cpu_s(os.getpid()) + 0.15
    assert tree_cpu_s(None) == 0.0


def test_children_stamp_files_are_found_beside_the_commands(tmp_path: Any) -> None:
    base = tmp_path / "worker.stamps"
    for name in ("worker.stamps", "worker.stamps.41", "worker.stamps.42", "other.stamps.1"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in stamp_files(base)] == ["worker.stamps.41", "worker.stamps.42"]
