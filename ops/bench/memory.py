"""Worker memory against backlog size: a `stream-jobs worker` process (the no-op app in
`ops/bench/apps.py`) drains backlogs of 10,000, 100,000 and 1,000,000 jobs, while its
VmRSS is sampled from /proc every 200 ms. A backlog lives on Kafka's disk, so the two
should match; the worker's CPU time per 1,000 jobs comes from its rusage."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from ops.bench.backlog import fill, rewind_worker_group
from ops.bench.common import Bench, BenchError, run_async
from ops.bench.snapshot import CODE_DIR, PROJECT_CLI

JOB_TYPE = "bench.mem"
SAMPLE_S = 0.2


def _status_kb(pid: int) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(rest.split()[0])
    return found


def watch_worker(b: Bench, prefix: str, n: int, log: Path) -> dict[str, Any]:
    """Run the worker process until it drains `n` jobs; its memory and CPU while it did."""
    argv = [str(PROJECT_CLI), "worker", "ops.bench.apps:app", "--type", JOB_TYPE,
            "--until-idle", "--log-level", "WARNING"]
    timeout_s = 120 + n / 1_000
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, cwd=CODE_DIR, env=b.env(prefix),
                                stdout=subprocess.DEVNULL, stderr=err)
        began = time.monotonic()
        samples: list[tuple[float, int]] = []
        hwm_kb = 0
        usage: resource.struct_rusage  # set by the first wait4, before any read
        try:
            while True:
                kb = _status_kb(proc.pid)
                if "VmRSS" in kb:
                    samples.append((time.monotonic() - began, kb["VmRSS"]))
                    hwm_kb = max(hwm_kb, kb.get("VmHWM", 0))
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() - began > timeout_s:
                    raise BenchError(f"the worker did not drain {n:,} jobs in "
                                     f"{timeout_s:.0f} s")
                time.sleep(SAMPLE_S)
        finally:
            if proc.returncode is None:  # timed out, or the bench is being stopped
                proc.kill()
                proc.wait(timeout=30)
    elapsed = time.monotonic() - began
    text = log.read_text(errors="replace")
    done = re.search(r"succeeded (\d+)", text)
    if proc.returncode != 0 or done is None or int(done.group(1)) != n:
        raise BenchError(f"the worker process (exit {proc.returncode}) did not report "
                         f"{n:,} successes: {text[-600:]}")
    if not samples:
        raise BenchError("no memory samples were taken")
    rss = [kb for _, kb in samples]
    quartiles = {f"rss_mb_at_{q}pct": rss[min(len(rss) - 1, len(rss) * q // 100)] / 1024
                 for q in (10, 25, 50, 75, 100)}
    cpu_s = usage.ru_utime + usage.ru_stime
    # Not rusage's ru_maxrss: on Linux a child inherits its parent's high-water mark at fork.
    return {"max_rss_mb": max(rss) / 1024, "peak_hwm_mb": hwm_kb / 1024,
            "cpu_s": cpu_s, "cpu_ms_per_1k": cpu_s * 1000 / (n / 1000), "elapsed_s": elapsed,
            "jobs_per_s_incl_startup": n / elapsed, "samples": len(samples), **quartiles}


def memory(b: Bench) -> None:
    runs = {"small": (b.scale.mem_small, b.scale.runs),
            "mid": (b.scale.mem_mid, b.scale.runs),
            "big": (b.scale.mem_big, b.scale.mem_big_runs)}
    found: dict[str, list[dict[str, Any]]] = {size: [] for size in runs}
    for size, (n, count) in runs.items():
        prefix = f"{b.prefix}-m{n}"
        s = b.settings(prefix)
        run_async(b.declare(JOB_TYPE, prefix=prefix), 60)
        rate = run_async(fill(s, JOB_TYPE, n), 60 + n / 500)
        b.results.details[f"memory_{size}_fill_jobs_per_s"] = rate
        for run in range(count):
            log = b.out_dir / f"memory-{size}-{run}.log"
            found[size].append(watch_worker(b, prefix, n, log))
            run_async(rewind_worker_group(s, JOB_TYPE), 60)
    b.results.details["memory_runs"] = found
    small_n, mid_n, big_n = b.scale.mem_small, b.scale.mem_mid, b.scale.mem_big
    r = b.results
    r.add("ours.rss_small", f"worker max RSS draining {small_n:,} jobs", "MiB",
          [x["max_rss_mb"] for x in found["small"]], "VmRSS sampled every 200 ms")
    r.add("ours.rss_mid", f"worker max RSS draining {mid_n:,} jobs", "MiB",
          [x["max_rss_mb"] for x in found["mid"]], "VmRSS sampled every 200 ms")
    r.add("ours.rss_big", f"worker max RSS draining {big_n:,} jobs", "MiB",
          [x["max_rss_mb"] for x in found["big"]],
          f"{len(found['big'])} run(s): see the note on the time budget")
    # The big run's CPU minus a small run's, per job: the marginal cost, without start-up.
    marginal = [(big["cpu_s"] - small["cpu_s"]) * 1000 / ((big_n - small_n) / 1000)
                for big in found["big"] for small in found["small"]]
    r.add("ours.cpu_per_1k", "worker CPU (user+sys) per 1,000 no-op jobs", "ms", marginal,
          "worker process rusage: (big run - small run) / (big N - small N), each pair")
