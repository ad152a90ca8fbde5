"""Processes of the local stack: pid files, liveness, ports, and waiting for readiness."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stream_jobs.errors import PortInUse, StackError


@dataclass(frozen=True)
class ServiceStatus:
    """One row of `stream-jobs dev status`."""

    name: str
    running: bool
    pid: int | None
    address: str
    connect: str
    log: Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); it is not running.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return False
    return True


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def read_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in `pid_file` if that process is alive and is ours (its command line has `marker`).

    A pid file left by a crash (dead process, or a pid reused by someone else) is removed.
    """
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    alive = pid_alive(pid)
    if alive and marker in cmdline(pid):
        return pid
    if not alive:
        _wait_released(pid)
    pid_file.unlink(missing_ok=True)
    return None


def _wait_released(pid: int, timeout_s: float = 10.0) -> None:
    """Return once no thread of the dead process `pid` runs (or after `timeout_s`).

    After SIGKILL the thread-group leader turns zombie while the other threads are still
    exiting, and until the last one is gone the process keeps its listening sockets: a
    restart in that window would find its own old port taken.
    """
    deadline = time.monotonic() + timeout_s
    while _has_live_thread(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.02)


def _has_live_thread(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            return True
    return False


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        return sock.connect_ex((host, port)) == 0


def ensure_port_free(host: str, port: int, what: str, setting: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Kafka binds with SO_REUSEADDR; without it here, the TIME_WAIT connections a
        # stopped or killed broker leaves behind would read as a stranger for a minute.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"{what} cannot start: {host}:{port} is already in use by another process; "
                f"stop that process or choose another port with {setting}."
            ) from exc


def spawn(argv: Sequence[str], log_file: Path, pid_file: Path, cwd: Path,
          env: Mapping[str, str] | None = None) -> int:
    """Start a long-running service detached from our session; its output goes to `log_file`
    (its environment is ours, or `env`)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    # Just after exec, /proc/<pid>/cmdline can read empty, and read_pid would then take the
    # new process for a stranger and drop its pid file; so the file waits for the cmdline.
    deadline = time.monotonic() + 5.0
    while not cmdline(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def wait_until(
    ready: Callable[[], bool],
    *,
    alive: Callable[[], bool],
    timeout_s: float,
    what: str,
    log_file: Path,
) -> None:
    """Poll `ready` until it holds; fail fast when the process dies, with its log's tail."""
    deadline = time.monotonic() + timeout_s
    interval = 0.1
    while time.monotonic() < deadline:
        if ready():
            return
        if not alive():
            raise StackError(f"{what} exited during start-up; its log {log_file} ends with:\n"
                             + tail(log_file))
        time.sleep(interval)  # polling a readiness probe, not waiting blind
        interval = min(interval * 1.5, 1.0)
    raise StackError(f"{what} was not ready after {timeout_s:.0f} s; see {log_file}:\n"
                     + tail(log_file))


def tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def stop_pid(pid: int, grace_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; returns once the process is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.1)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            _reap(pid)
            time.sleep(0.05)
    _wait_released(pid)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
