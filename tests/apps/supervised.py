"""A supervisor over children that need no services, for tests/unit/test_supervisor.py:

    python -m tests.apps.supervised MODE PROCESSES

The test runs it as a subprocess (the supervisor forks; a test process should not), sends
it signals and reads what it prints. Each child prints `ready <name> <pid>` once it waits,
then, by MODE:

- `drain`: waits for SIGTERM (or for its supervisor to die), then returns its counts;
- `slow-start`: as `drain`, but takes 0.3 s before it handles SIGTERM (a worker
  importing its app and joining its groups), so a stop can come before it is up;
- `crash`: exits with code 3 at once, every time;
- `refuse`: raises a StreamJobsError at once, every time (the one-sentence path);
- `stubborn`: ignores SIGTERM and waits for good (the supervisor has to kill it);
- `idle` (the supervisor runs with `until_idle`): says `idle` on its idle link, answers
  every `confirm R` with `still R`, and waits for SIGTERM; its counts say how many
  questions it answered;
- `idle-late`: as `idle`, but `worker-2` answers the first question with `busy` (a job
  came in) and then says `idle` again.

The restart policy is fast (delays of 10 to 50 ms, three quick deaths to give up) and the
stop bound short (1 s), so every case ends within seconds. The supervisor's result is
the last line on stdout, as JSON.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Mapping

import orjson

from stream_jobs import logs
from stream_jobs.errors import DatabaseUnavailable
from stream_jobs.runtime import agreement
from stream_jobs.runtime.host import accept_stop_signals
from stream_jobs.runtime.restarts import RestartPolicy
from stream_jobs.runtime.supervisor import Child, Supervisor

POLICY = RestartPolicy(first_delay_s=0.01, max_delay_s=0.05, stable_after_s=5.0,
                       give_up_after=3)
STOP_TIMEOUT_S = 1.0


class Stop(Exception):
    """SIGTERM reached a `drain` child."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Stop


def child_main(mode: str, child: Child) -> Mapping[str, Mapping[str, int]]:
    if mode.startswith("idle"):
        return idle_child(mode, child)
    if mode == "crash":
        raise SystemExit(3)
    if mode == "refuse":
        raise DatabaseUnavailable("The Postgres server did not answer.")
    if mode == "slow-start":
        time.sleep(0.3)  # importing and connecting: the SIGTERM may come meanwhile
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else _on_sigterm)
    try:
        accept_stop_signals()  # a SIGTERM held since the start arrives here
        print(f"ready {child.name} {os.getpid()}", flush=True)
        while True:
            readable, _, _ = select.select([child.lifeline], [], [])
            if readable and not os.read(child.lifeline, 1):
                return {"t": {"orphaned": 1}}  # end of file: the supervisor is gone
    except Stop:
        return {"t": {"succeeded": child.index}}


def idle_child(mode: str, child: Child) -> Mapping[str, Mapping[str, int]]:
    assert child.idle_link is not None
    link = socket.socket(fileno=child.idle_link)
    signal.signal(signal.SIGTERM, _on_sigterm)
    answered = 0
    late = mode == "idle-late" and child.index == 2
    try:
        accept_stop_signals()
        print(f"ready {child.name} {os.getpid()}", flush=True)
        link.send(agreement.IDLE)
        while True:
            round_no = agreement.confirm_round(link.recv(64))
            if round_no is None:
                continue
            if late:
                late = False
                link.send(agreement.BUSY)
                link.send(agreement.IDLE)
                continue
            answered += 1  # first: SIGTERM may come as soon as it is sent
            link.send(agreement.still(round_no))
    except Stop:
        return {"t": {"answered": answered}}


def main() -> None:
    mode, processes = sys.argv[1], int(sys.argv[2])
    logs.configure(level=logging.INFO)
    supervisor = Supervisor(processes, lambda child: child_main(mode, child), policy=POLICY,
                            stop_timeout_s=STOP_TIMEOUT_S, until_idle=mode.startswith("idle"))
    result = supervisor.run()
    print(orjson.dumps(dataclasses.asdict(result)).decode(), flush=True)
    sys.exit(result.exit_code)


if __name__ == "__main__":
    main()
