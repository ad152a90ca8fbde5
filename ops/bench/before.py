"""The no-op path of a type without `[fairness]`, against the code before issue 27.

The fair-queue work must cost nothing to a type that does not ask for it. The code of
`BEFORE_COMMIT` (the last commit before the tenant and the `[fairness]` table) is taken
out of the checkout's history (`git archive`) beside the snapshot under test, with the
bench's own modules copied in, and both drain the same no-op backlog of a type with no
`[fairness]` table: each in a process of its own (`python -m ops.bench.noop_drain`, the
processing section's no-op worker), interleaved in rounds (ops/bench/paired.py: which
goes first turns each round, the load average after each drain), the worker group
rewound between drains. Rates run from the first handler call to the last. The type has a
topics folder of its own: the code before issue 27 refuses a folder that holds a
`[fairness]` table.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

from ops.bench.backlog import fill, rewind_worker_group
from ops.bench.common import PARTITIONS, Bench, BenchError, declare_one, run_async
from ops.bench.paired import PAIRS, QUICK_PAIRS, Interleaved, interleave
from ops.bench.snapshot import CODE_DIR, PROJECT_PYTHON, REPO_DIR
from stream_jobs.settings import Settings

BEFORE_COMMIT = "5c82eb4"
NOOP_TYPE = "bench.fair-noop"
ARMS = ("now", "before")


def code_before(b: Bench) -> Path:
    """`stream_jobs/` as of BEFORE_COMMIT, and this bench's modules, in the run's folder."""
    folder = b.out_dir / f"code-{BEFORE_COMMIT}"
    try:
        tar = subprocess.run(["git", "-C", str(REPO_DIR), "archive", "--format=tar",
                              BEFORE_COMMIT, "stream_jobs"], capture_output=True, check=True,
                             timeout=120).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BenchError(f"could not take stream_jobs/ of {BEFORE_COMMIT} out of the "
                         f"checkout's history: {exc}") from exc
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(folder, filter="data")
    shutil.copytree(CODE_DIR / "ops" / "bench", folder / "ops" / "bench",
                    ignore=shutil.ignore_patterns("__pycache__", "out"))
    return folder


def _drain_in(b: Bench, settings: Settings, code: Path, n: int) -> float:
    """One no-op drain by the code in `code`, in a process of its own: its jobs/s."""
    env = {**b.env(), "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir),
           "PYTHONPATH": str(code)}
    done = subprocess.run([str(PROJECT_PYTHON), "-m", "ops.bench.noop_drain", NOOP_TYPE,
                           str(n)], cwd=code, env=env, capture_output=True, text=True,
                          timeout=1000, check=False)
    if done.returncode != 0:
        raise BenchError(f"the no-op drain of {code.name} failed: {done.stderr[-600:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


def noop_side_by_side(b: Bench) -> Interleaved:
    """jobs/s of each arm ("now": the snapshot, "before": BEFORE_COMMIT), interleaved."""
    n = b.scale.backlog_n
    settings = b.settings().model_copy(update={"topics_dir": b.out_dir / "topics-noop"})
    run_async(declare_one(settings, NOOP_TYPE, partitions=PARTITIONS, retry_tiers=["5s"],
                          max_attempts=2, retention="2h"), 60)
    run_async(fill(settings, NOOP_TYPE, n), 600)
    codes = {"now": CODE_DIR, "before": code_before(b)}

    def measure(arm: str) -> float:
        rate = _drain_in(b, settings, codes[arm], n)
        run_async(rewind_worker_group(settings, NOOP_TYPE), 60)
        return rate

    return interleave(ARMS, measure, QUICK_PAIRS if b.quick else PAIRS, "fairness no-op")
