"""The coverage-guided fuzz target (tests/fuzz/fuzz_record.py) with a fixed budget.

atheris drives libFuzzer, which exits the process when its budget is spent, so the
target runs in a child process. A crash makes the child fail with the input's traceback
and leaves the input as a crash-* file under pytest's tmp_path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")  # in the dev extra on x86_64 Linux, where it has wheels

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
BUDGET_S = 2


# fuzz_record: the record decoder; fuzz_surfaces: the outbox's headers column, workflow
# headers, unique keys and cron (issue 28).
@pytest.mark.parametrize("target", ["fuzz_record.py", "fuzz_surfaces.py"])
def test_the_decoder_survives_a_fixed_fuzzing_budget(tmp_path: Path, target: str) -> None:
    result = subprocess.run(
        [sys.executable, str(FUZZ / target), f"-max_total_time={BUDGET_S}", "-runs=100000",
         "-timeout=10", "-rss_limit_mb=1024", f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=60 + BUDGET_S, cwd=tmp_path, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Done " in result.stderr
    assert list(tmp_path.glob("crash-*")) == []
