"""When the supervisor restarts a worker process that ended, and when it gives up.

Pure: no processes, no clock. `stream_jobs.runtime.supervisor` asks `after_exit` each time
a child ends and does what it says.

A child that ends while the supervisor is not stopping is restarted, after a delay that
doubles with each *quick* death in a row (one within `stable_after_s` of its start), from
`first_delay_s` up to `max_delay_s`. A child that ran `stable_after_s` or longer had a good
run: its streak starts again from zero, so a crash once a day is restarted at once, every
day.

The supervisor gives up only when no child can stay up: when every child's streak has
reached `give_up_after`. Then it drains whatever still runs and exits 1, as a single
worker process does when it cannot start (the broker down at start, credentials refused),
so systemd or Kubernetes sees the failure and applies its own restart policy. While at
least one child stays up, a child that keeps dying is restarted every `max_delay_s` for
as long as it takes, each death logged as an error with its streak: its partitions are
served by the others meanwhile, and stopping them would only turn one broken process (a
metrics port taken, say) into an outage.

With `--until-idle` too: a child never ends by itself there (the supervisor stops them
all once they agree they are idle, `stream_jobs.runtime.agreement`), so one that ended
was stopped or crashed, and its partitions need a member again before the others can
agree.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """How the supervisor restarts children; the defaults are what `stream-jobs worker
    --processes N` uses."""

    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    # A child that lived this long had a good run: its quick deaths are forgotten.
    stable_after_s: float = 60.0
    # Quick deaths in a row of every child after which the supervisor gives up (0: never).
    give_up_after: int = 5

    def __post_init__(self) -> None:
        if not 0 < self.first_delay_s <= self.max_delay_s:
            raise ValueError("restart delays must be 0 < first_delay_s <= max_delay_s")
        if self.stable_after_s <= 0 or self.give_up_after < 0:
            raise ValueError("stable_after_s must be > 0 and give_up_after >= 0")


@dataclass(frozen=True)
class Restart:
    """Start the child again after `delay_s`; `quick_deaths` is its count now."""

    delay_s: float
    quick_deaths: int


def restart_delay_s(policy: RestartPolicy, quick_deaths: int) -> float:
    """The wait before a restart after `quick_deaths` quick deaths in a row (0: the child
    had a good run and is restarted after the first delay)."""
    doublings = max(0, quick_deaths - 1)
    # Capped before the power, so a long crash loop cannot overflow the float.
    if doublings >= 64:
        return policy.max_delay_s
    return min(policy.max_delay_s, policy.first_delay_s * 2.0 ** doublings)


def after_exit(policy: RestartPolicy, *, quick_deaths: int, lived_s: float) -> Restart:
    """What to do about a child that ended while the supervisor was not stopping.

    `quick_deaths` is the child's count before this exit, `lived_s` how long this run
    lasted. Whatever its exit code, it is restarted: a worker process never ends by
    itself while its supervisor runs.
    """
    count = quick_deaths + 1 if lived_s < policy.stable_after_s else 0
    return Restart(restart_delay_s(policy, count), count)


def streak_now(policy: RestartPolicy, quick_deaths: int, alive_s: float | None) -> int:
    """A child's streak of quick deaths as of now: a child that has been up for
    `stable_after_s` (`alive_s`; None while it waits for its restart) is past its streak."""
    if alive_s is not None and alive_s >= policy.stable_after_s:
        return 0
    return quick_deaths


def should_give_up(policy: RestartPolicy, streaks: Iterable[int]) -> bool:
    """Whether no child can stay up: every child's streak (`streak_now`) has reached
    `give_up_after`. Never with no children, nor with `give_up_after` 0."""
    found = list(streaks)
    return bool(policy.give_up_after and found
                and all(n >= policy.give_up_after for n in found))


def exit_code_of(wait_status: int) -> int:
    """A `waitpid` status as `subprocess` gives a return code: the exit code, or minus the
    signal that killed the process."""
    return os.waitstatus_to_exitcode(wait_status)


def describe_exit(exit_code: int) -> str:
    """"exited with code 1", "was killed by SIGKILL": what happened, for a log line."""
    if exit_code >= 0:
        return f"exited with code {exit_code}"
    try:
        name = signal.Signals(-exit_code).name
    except ValueError:
        name = f"signal {-exit_code}"
    return f"was killed by {name}"


__all__ = ["Restart", "RestartPolicy", "after_exit", "describe_exit", "exit_code_of",
           "restart_delay_s", "should_give_up", "streak_now"]
