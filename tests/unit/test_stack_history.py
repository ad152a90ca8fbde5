"""The local stack's history process as a process: started once with the settings it is
asked for, started again when they change, a start that fails says why, stopped by
SIGTERM. No services: `stream-jobs history` is a stand-in script here that prints the
command's first line and waits for SIGTERM (tests/integration/test_dev_stack.py runs the
real one on a stack of its own)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_jobs.errors import StackError
from stream_jobs.settings import Settings
from stream_jobs.stack import history as history_module
from stream_jobs.stack.history import HistoryProcess
from stream_jobs.stack.process import cmdline, pid_alive

# Says what it was started with, then runs until SIGTERM, as the real command does.
FAKE_HISTORY = f"""#!{sys.executable}
import os, signal, sys, time
prefix = sys.argv[sys.argv.index("--topic-prefix") + 1]
if os.environ.get("FAKE_HISTORY_FAILS"):
    print("error: the history app stopped on an error: no transactions here.", flush=True)
    sys.exit(1)
print(f"history of prefix {{prefix}} into schema "
      f"{{os.environ['STREAM_JOBS_DATABASE_SCHEMA']}}; Ctrl-C stops", flush=True)
print("data dir", os.environ["STREAM_JOBS_HISTORY_DATA_DIR"], flush=True)
signal.signal(signal.SIGTERM, lambda *_: (print("history stopped", flush=True), sys.exit(0)))
while True:
    time.sleep(60)  # waiting for SIGTERM, as the real command does
"""
BOOTSTRAP = "127.0.0.1:1"
DSN = "postgresql://stream_jobs@127.0.0.1:2/stream_jobs"


@pytest.fixture
def fake_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "stream-jobs"
    script.write_text(FAKE_HISTORY)
    script.chmod(0o755)
    monkeypatch.setattr(history_module, "cli_path", lambda: str(script))
    return script


@pytest.fixture
def stack(tmp_path: Path, fake_cli: Path) -> Iterator[Settings]:
    settings = Settings(stack_dir=tmp_path / "stack")
    yield settings
    for process in HistoryProcess.known(settings):
        process.down()


def test_up_starts_it_once_with_the_stack_settings(stack: Settings) -> None:
    process = HistoryProcess(stack)
    pid = process.up(BOOTSTRAP, DSN)
    assert pid_alive(pid)
    assert process.marker in cmdline(pid)
    assert process.home == stack.stack_dir.resolve() / "history" / "jobs"
    assert process.up(BOOTSTRAP, DSN) == pid  # idempotent
    log = process.log_file.read_text()
    assert "history of prefix jobs into schema public" in log
    assert f"data dir {process.data_dir}" in log
    assert process.started_with()["STREAM_JOBS_KAFKA_BOOTSTRAP"] == BOOTSTRAP
    assert process.env_file.stat().st_mode & 0o077 == 0  # the URL may hold a password
    row = process.status()
    assert (row.name, row.running, row.pid) == ("history jobs", True, pid)
    assert row.connect == "STREAM_JOBS_TOPIC_PREFIX=jobs STREAM_JOBS_DATABASE_SCHEMA=public"
    assert process.down() == [f"history jobs (pid {pid})"]
    assert not pid_alive(pid)
    assert process.log_file.read_text().endswith("history stopped\n")  # SIGTERM, not KILL
    assert process.down() == []
    assert not process.status().running


def test_other_settings_restart_it(stack: Settings) -> None:
    process = HistoryProcess(stack)
    first = process.up(BOOTSTRAP, DSN)
    moved = HistoryProcess(stack.model_copy(update={"database_schema": "elsewhere"}))
    second = moved.up(BOOTSTRAP, DSN)
    assert second != first
    assert not pid_alive(first)
    assert moved.status().address == "jobs._stats -> schema elsewhere"


def test_status_and_down_cover_every_prefix_that_runs(stack: Settings) -> None:
    mine = HistoryProcess(stack)
    other = HistoryProcess(stack.model_copy(update={"topic_prefix": "tour"}))
    stopped = HistoryProcess(stack.model_copy(update={"topic_prefix": "gone"}))
    other_pid = other.up(BOOTSTRAP, DSN)
    stopped.up(BOOTSTRAP, DSN)
    stopped.down()
    # The settings' prefix first (stopped or not), then the others that run.
    assert [p.name for p in HistoryProcess.known(stack)] == ["history jobs", "history tour"]
    assert not mine.status().running
    assert [name for p in HistoryProcess.known(stack) for name in p.down()] == [
        f"history tour (pid {other_pid})"]


def test_a_start_that_fails_says_why(stack: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HISTORY_FAILS", "1")
    process = HistoryProcess(stack)
    with pytest.raises(StackError) as failed:
        process.up(BOOTSTRAP, DSN)
    assert "The history of prefix jobs exited during start-up" in str(failed.value)
    assert "no transactions here" in str(failed.value)  # its log's tail
    assert process.pid() is None
    assert not process.pid_file.exists()


def test_the_command_is_the_one_beside_this_python() -> None:
    assert history_module.cli_path() == str(Path(sys.executable).with_name("stream-jobs"))
