"""Where the no-op processing path, and the live `ctx.once()` path, spend their time:
pyinstrument over a worker draining a backlog (ordering=key, the default), sampling the
whole thread (event loop included) every millisecond. Writes out/profile.html and
out/profile.txt (profile-once.* for ctx.once()); RESULTS.md gets the time by package,
the heaviest functions of stream_jobs and the top of the call tree.
"""

from __future__ import annotations

import heapq
import re
from collections import defaultdict
from typing import TYPE_CHECKING

from ops.bench.backlog import new_backlog
from ops.bench.common import Bench, run_async
from ops.bench.ours import drain, prepare_effects

if TYPE_CHECKING:  # pyinstrument is the `bench` extra, imported when the section runs
    from pyinstrument.frame import Frame

TREE_LINES = 70
LOOP_ROW = "event loop in C (uvloop): polling, waiting, scheduling"
TOP_FUNCTIONS = 15


def _package(path: str | None, function: str) -> str:
    """A frame's file as the package it belongs to (stream_jobs, aiokafka, asyncio, ...);
    a C function by its name (`epoll.poll` is the event loop waiting for the network)."""
    if not path:
        return "(native)"
    if path == "<built-in>":
        return f"built-in {function}"
    if path.endswith("asyncio/runners.py") or (path.endswith("ops/bench/common.py")
                                               and function == "run_async"):
        # Self time of the frame that entered the loop is time in the loop's own C code
        # (uvloop): polling, waiting for the network and running its scheduler.
        return LOOP_ROW
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/stream_jobs/" in path:
        return "stream_jobs"
    if "/ops/bench/" in path:
        return "bench (the no-op handler)"
    found = re.search(r"/lib/python3\.\d+/([^/]+)", path)
    if found:
        name = found.group(1).removesuffix(".py")
        return f"stdlib {name}"
    return path.rsplit("/", 1)[-1]


def _walk(frame: Frame, ancestors: frozenset[str], by_package: defaultdict[str, float],
          by_function: defaultdict[str, float]) -> None:
    if not frame.is_synthetic:
        by_package[_package(frame.file_path, frame.function)] += frame.total_self_time
        if frame.file_path and "/stream_jobs/" in frame.file_path:
            name = f"{frame.function} ({frame.file_path.rsplit('/stream_jobs/', 1)[1]})"
            if name not in ancestors:  # inclusive time, counted once per call chain
                by_function[name] += frame.time
                ancestors = ancestors | {name}
    for child in frame.children:
        _walk(child, ancestors, by_package, by_function)


def _heaviest(seconds: dict[str, float], n: int) -> list[tuple[str, float]]:
    """The `n` largest, in the order `Counter.most_common(n)` gives."""
    return heapq.nlargest(n, seconds.items(), key=lambda item: item[1])


def profile(b: Bench) -> None:
    """The no-op path, then the live `ctx.once()` path (a row per job, its effects table
    made first), each profiled from its first job to its last."""
    s = b.settings()
    n = b.scale.profile_n
    details = b.results.details
    new_backlog(b, "bench.profile", n)
    details["profile"] = _profiled(b, "bench.profile", n, None, "profile")
    run_async(prepare_effects(s, truncate=True), 60)
    new_backlog(b, "bench.profile-once", b.scale.once_n)
    details["profile_once"] = _profiled(b, "bench.profile-once", b.scale.once_n, "live",
                                        "profile-once")


def _profiled(b: Bench, job_type: str, n: int, once: str | None,
              name: str) -> dict[str, object]:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.001, async_mode="disabled")
    # Sampling runs from the first job to the last, so start-up and the idle check at the
    # end are not in the profile.
    try:
        result = run_async(drain(b.settings(), job_type, n, once=once,
                                 window=(profiler.start, profiler.stop)), 900)
    finally:
        if profiler.is_running:
            profiler.stop()
    session = profiler.last_session
    if session is None:
        return {}
    root = session.root_frame()
    # Seconds, not counts: typeshed's Counter holds ints only.
    by_package: defaultdict[str, float] = defaultdict(float)
    by_function: defaultdict[str, float] = defaultdict(float)
    if root is not None:
        _walk(root, frozenset(), by_package, by_function)
    total = sum(by_package.values()) or 1.0
    tree = profiler.output_text(unicode=False, color=False, show_all=False)
    (b.out_dir / f"{name}.txt").write_text(tree)
    (b.out_dir / f"{name}.html").write_text(profiler.output_html())
    return {
        "jobs": n,
        "rate_under_profiler": result["rate"],
        "duration_s": session.duration,
        "cpu_s": session.cpu_time,
        "by_package": [(name, t, t / total) for name, t in _heaviest(by_package, 14)],
        "stream_jobs_functions": [(name, t, t / total)
                                  for name, t in _heaviest(by_function, TOP_FUNCTIONS)],
        "tree": "\n".join(tree.splitlines()[:TREE_LINES]),
    }
