"""Where the bench runs from: a snapshot of the code taken when it starts (see run.py),
so a change to the checkout during a run cannot mix two versions into one set of figures.
CODE_DIR holds the code under test; REPO_DIR is the checkout (venvs, out/, RESULTS.md)."""

from __future__ import annotations

import os
from pathlib import Path

SNAPSHOT_ENV = "BENCH_SNAPSHOT"
CODE_DIR = Path(__file__).resolve().parents[2]
REPO_DIR = Path(os.environ.get("BENCH_REPO_DIR") or CODE_DIR)
BENCH_DIR = REPO_DIR / "ops" / "bench"
OUT_DIR = BENCH_DIR / "out"
PROJECT_PYTHON = REPO_DIR / ".venv" / "bin" / "python"
PROJECT_CLI = REPO_DIR / ".venv" / "bin" / "stream-jobs"
