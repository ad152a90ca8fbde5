"""The worker group under test: real `stream-jobs worker` processes, started, killed,
stopped, paused and resumed by the scenarios.

Every process logs to its own file under the run's folder; every one still running when
the run ends is killed (by its pid, never by name).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.chaos.app import DELIVERIES_DIR_ENV, HOLD_MS_ENV, JOB_TYPE, TIMEOUT_S_ENV
from stream_jobs.settings import Settings

REPO = Path(__file__).resolve().parents[2]
APP_SPEC = "ops.chaos.app:app"
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")


class WorkerError(Exception):
    """A worker process did not do what the scenario needed (exit, start)."""


@dataclass
class WorkerProcess:
    """One `stream-jobs worker` subprocess."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    started_at: float
    paused: bool = False
    killed_at: float | None = None  # time.time() of its SIGKILL

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} (pid {self.pid}) ---\n" + "\n".join(text.splitlines()[-lines:])


@dataclass
class WorkerGroup:
    """The worker processes of one run: all on the run's settings and delivery log folder."""

    settings: Settings
    folder: Path
    hold_ms: int = 1
    handler_timeout_s: float = 30.0
    members: list[WorkerProcess] = field(default_factory=list)
    killed: list[WorkerProcess] = field(default_factory=list)
    # Another command than the chaos worker (the failover scenario runs schedulers), and
    # environment variables of its own.
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    _count: int = 0

    @property
    def deliveries_dir(self) -> Path:
        return self.folder / "deliveries"

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.members if w.running]

    def start(self) -> WorkerProcess:
        self._count += 1
        name = f"w{self._count:02d}"
        self.deliveries_dir.mkdir(parents=True, exist_ok=True)
        s = self.settings
        env = {
            **os.environ,
            "STREAM_JOBS_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
            "STREAM_JOBS_DATABASE_URL": s.database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": s.database_schema,
            "STREAM_JOBS_TOPIC_PREFIX": s.topic_prefix,
            "STREAM_JOBS_TOPICS_DIR": str(s.topics_dir),
            DELIVERIES_DIR_ENV: str(self.deliveries_dir),
            HOLD_MS_ENV: str(self.hold_ms),
            TIMEOUT_S_ENV: str(self.handler_timeout_s),
            **self.env,
        }
        log = self.folder / f"{name}.log"
        with log.open("wb") as out:
            argv = list(self.argv) or [str(STREAM_JOBS), "worker", APP_SPEC, "--type", JOB_TYPE]
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        worker = WorkerProcess(name, proc, log, time.time())
        self.members.append(worker)
        return worker

    def kill(self, worker: WorkerProcess) -> None:
        """SIGKILL: no drain, no commit, no goodbye to the group."""
        worker.proc.send_signal(signal.SIGKILL)
        worker.killed_at = time.time()
        worker.proc.wait(timeout=30)
        self.killed.append(worker)

    def pause(self, worker: WorkerProcess) -> None:
        worker.proc.send_signal(signal.SIGSTOP)
        worker.paused = True

    def resume(self, worker: WorkerProcess) -> None:
        worker.proc.send_signal(signal.SIGCONT)
        worker.paused = False

    def terminate(self, worker: WorkerProcess) -> None:
        """Ask for a clean stop (SIGTERM drains); `stopped` waits for it."""
        worker.proc.send_signal(signal.SIGTERM)

    def stopped(self, worker: WorkerProcess, within_s: float = 60.0) -> int:
        """Wait for the process to exit; its exit code. WorkerError past `within_s`."""
        try:
            return worker.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired as exc:
            raise WorkerError(f"{worker.name} did not exit within {within_s:.0f} s after "
                              f"SIGTERM\n{worker.tail()}") from exc

    def tails(self) -> str:
        return "\n".join(w.tail() for w in self.members)

    def close(self) -> None:
        """Kill whatever still runs (paused ones are resumed first so they can die)."""
        for worker in self.members:
            if worker.running:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signal.SIGCONT)
                    worker.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=30)
