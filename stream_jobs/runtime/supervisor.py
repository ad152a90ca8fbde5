"""`stream-jobs worker APP --processes N`: N forked worker processes under one supervisor.

A worker process is one event loop, so it uses one core at most; N of them use N. The
supervisor forks children `worker-1` .. `worker-N`, each running the whole command's
types (a `stream_jobs.runtime.host.WorkerHost`): every child is one more member of each
type's consumer groups, so Kafka shares the partitions among them as among separate
hosts. The supervisor itself runs no event loop, no Kafka client and no pool: it only
forks, waits for signals and children, and restarts. That keeps the fork safe (a child
inherits the imported app and nothing live) and the supervisor too simple to fail.

- **Restarts**: a child that dies is started again under the same name, after the
  delay `stream_jobs.runtime.restarts` gives (doubling from 0.5 s up to 30 s while it
  keeps dying within a minute of its start). Its unfinished jobs are redelivered (no
  offset past them was committed), and `ctx.once()` keeps their effects single. The
  supervisor gives up, drains the rest and exits 1 only when every child keeps dying.
- **Stopping**: SIGTERM or SIGINT to the supervisor is forwarded to every child as
  SIGTERM, each drains as a single worker does, and the supervisor waits for them up to
  `stop_timeout_s` (30 s: the 10 s grace period, the final commits and leaving the
  groups, with room); a child still running then is killed. Exit code 0 when every
  child running at the stop drained cleanly, 1 otherwise or when the supervisor gave
  up. A child whose supervisor dies (even by SIGKILL) sees its lifeline pipe close and
  drains by itself, so no child is left orphaned and working. A child starts with
  SIGTERM and SIGINT held, and lets them through once its host drains on them
  (`stream_jobs.runtime.host.accept_stop_signals`): a stop during its start-up (a Ctrl-C
  just after the command starts) drains it once it is up, rather than killing it.
- **Until idle**: with `--until-idle` no child exits by itself, since a job one child
  writes may be for a partition another reads. Each child tells the supervisor when its
  own check finds it idle, through a socket of its own (`Child.idle_link`; its messages
  wake the supervisor with SIGIO); once all have, the supervisor asks them to confirm,
  and when every one has (`stream_jobs.runtime.agreement`) it stops them as on SIGTERM.
- **Counts**: each child sends what it counted through a pipe as it exits; the
  supervisor adds them up over all children and runs. A killed child's run sends
  nothing, and `SupervisorResult.unreported` names it.

Signals reach the supervisor through `sigtimedwait` with SIGCHLD, SIGTERM, SIGINT and
SIGIO blocked, so nothing runs inside a signal handler and no wait polls.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson

from stream_jobs.errors import ConfigError, StreamJobsError
from stream_jobs.runtime.agreement import Agreed, Ask, IdleAgreement, confirm
from stream_jobs.runtime.host import Counts, add_counts
from stream_jobs.runtime.restarts import (
    RestartPolicy,
    after_exit,
    describe_exit,
    exit_code_of,
    should_give_up,
    streak_now,
)

log = logging.getLogger("stream_jobs.supervisor")

# The 10 s grace period for running jobs, the final commits and leaving the groups, with
# room; systemd's TimeoutStopSec and Kubernetes' grace period should be longer (45 s).
STOP_TIMEOUT_S = 30.0
# The longest the supervisor blocks without looking at its children again.
MAX_WAIT_S = 60.0
_SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGIO}
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Child:
    """What a child knows of itself: its number (1..N), its end of the lifeline pipe,
    which reads end-of-file once the supervisor is gone, and with `--until-idle` its end
    of the socket it tells the supervisor it is idle through."""

    index: int
    lifeline: int
    idle_link: int | None = None

    @property
    def name(self) -> str:
        return child_name(self.index)


def processes_of(text: str, cpus: int) -> int:
    """`--processes`: a whole number of at least 1, or `auto` (`cpus`, the CPUs this
    process may use). Raises `ConfigError` with one sentence."""
    given = text.strip().lower()
    if given == "auto":
        return max(1, cpus)
    if given.isdigit() and int(given) >= 1:
        return int(given)
    raise ConfigError(f"--processes (STREAM_JOBS_WORKER_PROCESSES) takes a number of worker "
                      f"processes, 1 or more, or auto (one per CPU), not {text!r}.")


def child_name(index: int) -> str:
    """`worker-2`: the process name in the child's log lines (`process` field)."""
    return f"worker-{index}"


# Runs in the forked child and returns what it counted; raising ends the child with 1.
ChildMain = Callable[[Child], Mapping[str, Mapping[str, int]]]


@dataclass
class _Slot:
    """One child's place: the process in it now, if any, and its history."""

    index: int
    pid: int | None = None
    started_at: float = 0.0
    status_fd: int | None = None
    # With --until-idle: the supervisor's end of the child's idle socket.
    link: socket.socket | None = None
    runs: int = 0
    quick_deaths: int = 0
    restart_at: float | None = None
    last_exit: int | None = None

    @property
    def name(self) -> str:
        return child_name(self.index)


@dataclass
class SupervisorResult:
    """How the supervisor ended: its exit code, the counts its children sent, the
    restarts per child, and the runs whose counts were lost (killed children)."""

    exit_code: int
    counts: Counts = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    unreported: list[str] = field(default_factory=list)
    gave_up: bool = False


class Supervisor:
    """Forks `processes` children that each run `child_main`, restarts those that die,
    and drains them all on SIGTERM/SIGINT. `run` blocks; call it from the main thread of
    a process that has no event loop, Kafka client or database pool yet."""

    def __init__(self, processes: int, child_main: ChildMain, *, until_idle: bool = False,
                 policy: RestartPolicy | None = None,
                 stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        if processes < 1:
            raise ValueError("a supervisor needs at least one process")
        self.child_main = child_main
        self.until_idle = until_idle
        self.policy = policy or RestartPolicy()
        self.stop_timeout_s = stop_timeout_s
        self._slots = [_Slot(i) for i in range(1, processes + 1)]
        self._result = SupervisorResult(exit_code=0)
        self._stopping = False
        self._stop_deadline = 0.0
        # Children that were running at the stop and did not end with exit code 0.
        self._unclean: list[str] = []
        self._mask: set[int | signal.Signals] = set()
        self._lifeline: tuple[int, int] | None = None
        self._agreement = (IdleAgreement(frozenset(s.index for s in self._slots))
                           if until_idle else None)

    # -- the supervisor's loop --------------------------------------------------------------

    def run(self) -> SupervisorResult:
        """Run the children until stopped (or, with `until_idle`, until all are idle)."""
        # Inherited SIGCHLD ignored would reap the children behind our back (no exit codes).
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        self._lifeline = os.pipe()
        try:
            for slot in self._slots:
                self._spawn(slot)
            while self._busy():
                found = signal.sigtimedwait(_SIGNALS, self._wait_s())
                if found is not None and found.si_signo in _STOP_SIGNALS:
                    self._stop(f"{signal.Signals(found.si_signo).name} received")
                self._hear()
                self._reap()
                if self._stopping:
                    if time.monotonic() >= self._stop_deadline:
                        self._kill_stragglers()
                    continue
                if self._no_child_stays_up():
                    self._give_up()
                    continue
                self._restart_due()
        finally:
            # Closing the lifeline tells any child still running (only if this loop
            # failed) that its supervisor is gone: it drains and exits by itself.
            for fd in self._lifeline:
                os.close(fd)
            for slot in self._slots:
                if slot.status_fd is not None:
                    os.close(slot.status_fd)
                    slot.status_fd = None
                if slot.link is not None:
                    slot.link.close()
                    slot.link = None
            # A SIGIO still pending (a child's last words) would end this process once
            # unblocked: SIGIO's default action. With the sockets closed, none comes after.
            while signal.sigtimedwait({signal.SIGIO}, 0) is not None:
                pass
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        self._result.restarts = {s.name: s.runs - 1 for s in self._slots if s.runs > 1}
        self._result.exit_code = 1 if self._result.gave_up or self._unclean else 0
        return self._result

    def _busy(self) -> bool:
        return any(s.pid is not None or (s.restart_at is not None and not self._stopping)
                   for s in self._slots)

    def _wait_s(self) -> float:
        now = time.monotonic()
        due = [s.restart_at for s in self._slots if s.restart_at is not None]
        if self._stopping:
            due = [self._stop_deadline]
        return max(0.0, min([MAX_WAIT_S, *(at - now for at in due)]))

    def _stop(self, why: str) -> None:
        """Forward SIGTERM to every child (again, on a second signal) and start the clock."""
        if not self._stopping:
            self._stopping = True
            self._stop_deadline = time.monotonic() + self.stop_timeout_s
            running = [s.name for s in self._slots if s.pid is not None]
            log.info("%s: draining %s (SIGTERM), waiting up to %g s", why,
                     ", ".join(running) or "no running process", self.stop_timeout_s)
        for slot in self._slots:
            slot.restart_at = None
            if slot.pid is not None:
                _signal(slot.pid, signal.SIGTERM)

    def _kill_stragglers(self) -> None:
        for slot in self._slots:
            if slot.pid is None:
                continue
            log.warning("%s did not stop within %g s of the SIGTERM: killed; its unfinished "
                        "jobs are redelivered (no offset past them was committed)",
                        slot.name, self.stop_timeout_s, extra={"child": slot.name})
            _signal(slot.pid, signal.SIGKILL)
            _, status = os.waitpid(slot.pid, 0)
            self._ended(slot, exit_code_of(status))

    def _no_child_stays_up(self) -> bool:
        now = time.monotonic()
        return should_give_up(self.policy, (
            streak_now(self.policy, s.quick_deaths,
                       None if s.pid is None else now - s.started_at)
            for s in self._slots))

    def _give_up(self) -> None:
        last = ", ".join(f"{s.name} {describe_exit(s.last_exit)}" for s in self._slots
                         if s.last_exit is not None)
        log.error("every worker process died within %g s of its start %d times in a row "
                  "(last: %s); giving up: the log lines above say why",
                  self.policy.stable_after_s, self.policy.give_up_after, last)
        self._result.gave_up = True
        self._stop("giving up")

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                slot.restart_at = None
                self._spawn(slot)

    # -- until idle ---------------------------------------------------------------------------

    def _hear(self) -> None:
        """Read what the children said on their idle sockets, and act on it."""
        if self._agreement is None or self._stopping:
            return
        for slot in self._slots:
            while slot.link is not None:
                try:
                    message = slot.link.recv(64)
                except OSError:  # nothing more to read now (or the child is ending)
                    break
                if not message:  # the child closed it: it is ending (SIGCHLD follows)
                    break
                self._act(self._agreement.heard(slot.index, message))
                if self._stopping:
                    return

    def _act(self, decision: Ask | Agreed | None) -> None:
        if isinstance(decision, Agreed):
            self._stop("every worker process is idle (no job in a lane, a delay tier, the "
                       "outbox or a handler)")
        elif isinstance(decision, Ask):
            for slot in self._slots:
                if slot.index in decision.children and slot.link is not None:
                    # A child gone meanwhile does not answer: its end ends the round.
                    with contextlib.suppress(OSError):
                        slot.link.send(confirm(decision.round_no))

    # -- children ending --------------------------------------------------------------------

    def _reap(self) -> None:
        """Collect every child that ended (one SIGCHLD may stand for several)."""
        by_pid = {s.pid: s for s in self._slots if s.pid is not None}
        while by_pid:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = by_pid.pop(pid, None)
            if slot is not None:
                self._ended(slot, exit_code_of(status))

    def _ended(self, slot: _Slot, exit_code: int) -> None:
        lived_s = time.monotonic() - slot.started_at
        slot.pid = None
        slot.last_exit = exit_code
        if slot.link is not None:
            slot.link.close()
            slot.link = None
        if self._agreement is not None:
            self._agreement.ended(slot.index)
        counts = self._read_counts(slot)
        what = describe_exit(exit_code)
        if counts is None:
            self._result.unreported.append(f"{slot.name} (run {slot.runs}, {what})")
        else:
            add_counts(self._result.counts, counts)
        fields = {"child": slot.name}
        if self._stopping:
            if exit_code != 0:
                self._unclean.append(slot.name)
            level = logging.INFO if exit_code == 0 else logging.WARNING
            log.log(level, "%s %s after the stop", slot.name, what, extra=fields)
            return
        decision = after_exit(self.policy, quick_deaths=slot.quick_deaths, lived_s=lived_s)
        slot.quick_deaths = decision.quick_deaths
        slot.restart_at = time.monotonic() + decision.delay_s
        if decision.quick_deaths >= max(1, self.policy.give_up_after):
            log.error("%s keeps dying within %g s of its start (%d times in a row, last: %s "
                      "after %.1f s); restarting it every %g s while the others run: its "
                      "own log lines above say why", slot.name, self.policy.stable_after_s,
                      decision.quick_deaths, what, lived_s, decision.delay_s, extra=fields)
        else:
            log.error("%s %s after %.1f s; restarting it in %g s", slot.name, what, lived_s,
                      decision.delay_s, extra=fields)

    def _read_counts(self, slot: _Slot) -> Mapping[str, Mapping[str, int]] | None:
        fd = slot.status_fd
        if fd is None:
            return None
        slot.status_fd = None
        chunks = []
        try:
            # The child has exited, so its end is closed: this reads to end-of-file.
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
        if not chunks:
            return None
        try:
            found = orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError:
            return None
        return found if isinstance(found, dict) else None

    # -- children starting ------------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        assert self._lifeline is not None
        # Whatever is buffered would be written twice, once by each process.
        sys.stdout.flush()
        sys.stderr.flush()
        status_r, status_w = os.pipe()
        # Datagrams keep each message whole; the supervisor's end is read on SIGIO.
        link = (socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                if self._agreement is not None else None)
        if link is not None:
            _woken_by(link[0])
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(status_r)
            child_link = None
            if link is not None:
                link[0].close()
                child_link = link[1].detach()
            self._be_child(slot, status_w, child_link)
        os.close(status_w)
        if link is not None:
            link[1].close()
            slot.link = link[0]
        if self._agreement is not None:
            self._agreement.started(slot.index)
        slot.pid = pid
        slot.status_fd = status_r
        slot.started_at = time.monotonic()
        slot.runs += 1
        again = f", run {slot.runs}" if slot.runs > 1 else ""
        log.info("%s started (pid %d%s)", slot.name, pid, again, extra={"child": slot.name})

    def _be_child(self, slot: _Slot, status_w: int, idle_link: int | None) -> None:
        code = 1
        try:
            assert self._lifeline is not None
            lifeline_r, lifeline_w = self._lifeline
            os.close(lifeline_w)  # only the supervisor holds the write end
            for other in self._slots:
                if other.status_fd is not None:
                    os.close(other.status_fd)
                if other.link is not None:
                    other.link.close()
            # SIGTERM and SIGINT stay held until the child's host has its handlers
            # (`host.accept_stop_signals`): one that came before (a Ctrl-C just after the
            # start) killed the child half-started, and the command exited 1.
            signal.pthread_sigmask(signal.SIG_SETMASK, {*self._mask, *_STOP_SIGNALS})
            multiprocessing.current_process().name = slot.name
            counts = self.child_main(Child(slot.index, lifeline_r, idle_link))
            code = 0
            with contextlib.suppress(BrokenPipeError):  # the supervisor is gone
                _write_all(status_w, orjson.dumps(counts))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except KeyboardInterrupt:
            code = 130
        except StreamJobsError as exc:
            log.error("%s cannot run: %s", slot.name, exc, extra={"child": slot.name})
        except BaseException:  # a bug: shown as Python shows it, then this child ends
            traceback.print_exc()
        finally:
            _exit_child(code)


def _woken_by(sock: socket.socket) -> None:
    """Make `sock` non-blocking, and send this process SIGIO when there is something to
    read in it: the supervisor's loop waits for signals, not for files."""
    sock.setblocking(False)
    fd = sock.fileno()
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _exit_child(code: int) -> None:
    """End a forked child without returning into the supervisor's stack. Exit handlers
    (atexit: logging's flush, the app's own) run in the child, as they would at the end
    of a single worker process."""
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended: the next reap collects it
        os.kill(pid, sig)


__all__ = ["STOP_TIMEOUT_S", "Child", "ChildMain", "Supervisor", "SupervisorResult",
           "child_name", "processes_of"]
