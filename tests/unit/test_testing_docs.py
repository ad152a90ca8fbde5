"""docs/testing.md's in-memory examples run as they are written: its type file, app module
and tests become a project of their own in a temporary folder, and pytest runs that test there
with the installed plugin (the `job_tester` fixture) and no stream-jobs settings at all,
as on a user's machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "testing.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SECTION = "## In memory: `JobTester`"


def example_files() -> dict[str, str]:
    """The in-memory section's code blocks whose first line names their file."""
    text = DOC.read_text()
    start = text.index(SECTION)
    section = text[start:text.index("\n## ", start + len(SECTION))]
    files = {}
    for _, body in FENCE.findall(section):
        first = body.splitlines()[0]
        if first.startswith("# ") and "/" in first and " " not in first[2:]:
            files[first[2:]] = body
    return files


def test_the_in_memory_example_is_a_project_whose_test_passes(tmp_path: Path) -> None:
    files = example_files()
    assert set(files) == {"topics/signup.welcome.toml", "myapp/signup.py",
                          "tests/test_signup.py", "tests/test_signup_control.py"}
    for name, body in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_JOBS_")}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
