"""docs/testing.md's in-memory examples run as they are written: its type file, app module,
tests and pytest configuration become a project of their own in a temporary folder, and a
plain `pytest` runs its tests there, as a user types it in their project's root: with the
installed plugin (the `job_tester` fixture), no stream-jobs settings, nothing on
`PYTHONPATH` for the project. Without the page's `pythonpath` line that run cannot import
the app (as the issue that added the line found), and with it the tests pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.docs.samples import project_files, write_project

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "testing.md"
SECTION = "## In memory: `JobTester`"
PYTEST = Path(sys.executable).parent / "pytest"


def plain_pytest(project: Path) -> subprocess.CompletedProcess[str]:
    """`pytest -q` in `project`, with the environment of a user's shell there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_JOBS_")}
    # Our own run may put this checkout on PYTHONPATH; the project's folder never is.
    assert str(project) not in env.get("PYTHONPATH", "").split(os.pathsep)
    return subprocess.run([str(PYTEST), "-q", "-p", "no:cacheprovider"], cwd=project,
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_in_memory_example_is_a_project_whose_tests_pass(tmp_path: Path) -> None:
    files = project_files(DOC, SECTION)
    assert set(files) == {"topics/signup.welcome.toml", "myapp/signup.py",
                          "tests/test_signup.py", "tests/test_signup_control.py",
                          "pyproject.toml"}
    config = files.pop("pyproject.toml")
    write_project(tmp_path, files)

    without = plain_pytest(tmp_path)
    assert without.returncode != 0
    assert "No module named 'myapp'" in without.stdout + without.stderr

    write_project(tmp_path, {"pyproject.toml": config})
    done = plain_pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
