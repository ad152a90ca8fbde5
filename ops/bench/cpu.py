"""CPU seconds of processes and of the machine, read from /proc (Linux): what a figure
cost, split between our worker, the broker and Postgres."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()  # the name in (...) may hold spaces


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads); 0 once it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores, not idle or iowait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds of a process and its children: itself, its live children, and those it
    reaped (their time is in its cutime). A server's backends (Postgres) and a supervisor's
    workers (`stream-jobs worker --processes N`) are counted whole, exited ones included."""
    if pid is None:
        return 0.0
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    reaped = (int(fields[13]) + int(fields[14])) / _TICKS
    return process_cpu_s(pid) + reaped + sum(process_cpu_s(p) for p in children_of(pid))


def postgres_cpu_s(postmaster: int | None) -> float:
    """CPU seconds of a Postgres server: the postmaster, its live backends and helpers,
    and those that exited (the postmaster reaps them, so their time is in its cutime)."""
    return tree_cpu_s(postmaster)
