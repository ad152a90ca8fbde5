"""The supervisor's process handling, on children that need no services.

Each test runs `python -m tests.apps.supervised MODE N` as a subprocess (it forks; the
test process should not) and drives it with signals: a killed child is restarted under
its name, SIGTERM is forwarded and drains, a child that ignores it is killed at the
bound, a child that can never start makes the supervisor give up, children whose
supervisor is SIGKILLed stop by themselves, and with `--until-idle` the children are
stopped only once every one has confirmed it is idle. No test sleeps to wait: each polls what the
processes printed, or /proc, against a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.waiting import until

REPO = Path(__file__).resolve().parents[2]


class Supervised:
    """One `tests.apps.supervised` run: its process, stdout and stderr in files."""

    def __init__(self, tmp_path: Path, mode: str, processes: int) -> None:
        self.out = tmp_path / "out.txt"
        self.err = tmp_path / "err.txt"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.apps.supervised", mode, str(processes)],
                cwd=REPO, stdout=out, stderr=err)

    def text(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def ready(self) -> dict[str, int]:
        """The latest pid each child reported, by name."""
        found = {}
        for line in self.out.read_text().splitlines():
            if line.startswith("ready "):
                _, name, pid = line.split()
                found[name] = int(pid)
        return found

    def readies(self) -> int:
        return self.out.read_text().count("ready ")

    async def exit_code(self, within_s: float = 20) -> int:
        await until(lambda: self.proc.poll() is not None,
                    f"the supervisor exits\n{self.text()}", within_s)
        assert self.proc.returncode is not None
        return self.proc.returncode

    def result(self) -> dict[str, Any]:
        last = self.out.read_text().strip().splitlines()[-1]
        found: dict[str, Any] = orjson.loads(last)
        return found


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Any]:
    runs: list[Supervised] = []

    def start(mode: str, processes: int = 2) -> Supervised:
        run = Supervised(tmp_path, mode, processes)
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(10)
        for pid in run.ready().values():  # children of a test that failed half-way
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_sigterm_drains_every_child_and_adds_up_their_counts(supervised: Any) -> None:
    run = supervised("drain", 3)
    await until(lambda: len(run.ready()) == 3, "three children wait")
    run.proc.send_signal(signal.SIGTERM)
    assert await run.exit_code() == 0, run.text()
    result = run.result()
    assert result["counts"] == {"t": {"succeeded": 1 + 2 + 3}}
    assert (result["restarts"], result["unreported"], result["gave_up"]) == ({}, [], False)
    assert "SIGTERM received: draining worker-1, worker-2, worker-3" in run.text()


async def test_a_stop_while_the_children_start_drains_them_once_up(supervised: Any) -> None:
    """A Ctrl-C just after `worker --processes N` started killed its children by SIGTERM
    before they handled it, and the command exited 1."""
    run = supervised("slow-start", 2)
    await until(lambda: run.text().count(" started (pid ") == 2, "both children forked")
    run.proc.send_signal(signal.SIGTERM)
    assert await run.exit_code() == 0, run.text()
    assert run.result()["counts"] == {"t": {"succeeded": 3}}


async def test_a_killed_child_is_restarted_under_its_name(supervised: Any) -> None:
    run = supervised("drain", 2)
    await until(lambda: len(run.ready()) == 2, "two children wait")
    first = run.ready()["worker-2"]
    os.kill(first, signal.SIGKILL)
    await until(lambda: run.readies() == 3, f"worker-2 is started again\n{run.text()}")
    assert run.ready()["worker-2"] != first
    assert "worker-2 was killed by SIGKILL after" in run.text()
    run.proc.send_signal(signal.SIGTERM)
    assert await run.exit_code() == 0, run.text()  # both running children drained
    result = run.result()
    assert result["restarts"] == {"worker-2": 1}
    assert result["unreported"] == ["worker-2 (run 1, was killed by SIGKILL)"]
    assert result["counts"] == {"t": {"succeeded": 1 + 2}}  # the second run of worker-2


async def test_a_child_that_ignores_sigterm_is_killed_at_the_bound(supervised: Any) -> None:
    run = supervised("stubborn", 1)
    await until(lambda: len(run.ready()) == 1, "the child waits")
    run.proc.send_signal(signal.SIGTERM)
    assert await run.exit_code() == 1, run.text()
    assert "worker-1 did not stop within 1 s of the SIGTERM: killed" in run.text()
    assert not _alive(run.ready()["worker-1"])


async def test_children_that_never_start_make_the_supervisor_give_up(supervised: Any) -> None:
    run = supervised("crash", 2)
    assert await run.exit_code() == 1, run.text()
    result = run.result()
    assert result["gave_up"] is True
    # Three quick deaths each, the last one ending it: 2 restarts for each child.
    assert result["restarts"] == {"worker-1": 2, "worker-2": 2}
    text = run.text()
    assert "worker-1 exited with code 3 after" in text
    assert "every worker process died within 5 s of its start 3 times in a row" in text


async def test_a_child_that_cannot_run_says_why_in_one_sentence(supervised: Any) -> None:
    run = supervised("refuse", 1)
    assert await run.exit_code() == 1, run.text()
    text = run.text()
    assert "worker-1 cannot run: The Postgres server did not answer." in text
    assert "Traceback" not in text


async def test_children_of_a_killed_supervisor_stop_by_themselves(supervised: Any) -> None:
    run = supervised("drain", 2)
    await until(lambda: len(run.ready()) == 2, "two children wait")
    children = list(run.ready().values())
    run.proc.kill()  # no chance to forward anything
    assert await run.exit_code() == -signal.SIGKILL
    # Orphans are reaped by init; until then they are zombies, which _alive ignores.
    await until(lambda: not any(_alive(pid) for pid in children),
                "the orphaned children exit", within_s=10)


async def test_until_idle_the_supervisor_stops_the_children_once_all_confirm(
        supervised: Any) -> None:
    run = supervised("idle", 3)
    assert await run.exit_code() == 0, run.text()
    assert run.result()["counts"] == {"t": {"answered": 3}}  # one question each
    assert "every worker process is idle" in run.text()


async def test_until_idle_a_child_busy_when_asked_calls_the_round_off(supervised: Any) -> None:
    run = supervised("idle-late", 2)
    assert await run.exit_code() == 0, run.text()
    # worker-1 answered rounds 1 and 2, worker-2 only round 2.
    assert run.result()["counts"] == {"t": {"answered": 3}}
