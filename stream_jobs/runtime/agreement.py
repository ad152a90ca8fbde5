"""When every worker process of `--processes N --until-idle` is idle at once.

Pure: no processes, no sockets. The supervisor (`stream_jobs.runtime.supervisor`) feeds
`IdleAgreement` what its children say and does what it answers; each child's side is
`stream_jobs.runtime.idle.IdleWatch` with an `IdleLink`.

One child cannot know that the others are idle: a job one child's handler writes may be
for a partition another child reads. So no child exits by itself. A child whose own
check finds it idle (`stream_jobs.runtime.idle`) says `idle`, and `busy` as soon as
anything comes in after that. Once every child has said `idle` (and none `busy` since),
the supervisor asks them all to `confirm` round R; each answers `still R` only after a
check that began after the question found it idle *with nothing come in since its
`idle`*. So there is an instant (the question) inside every child's quiet interval: no
handler ran anywhere then, and each child's check after it found its partitions read to
their ends and the outbox empty. Only then does the supervisor stop them. A `busy`, a
child ending or starting, cancels the round; answers to an older round are ignored (a
child's messages arrive in order, so a `busy` always comes before the `still` of a
later quiet spell).

Messages are one datagram each: `idle`, `busy` and `still R` from a child, `confirm R`
from the supervisor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

IDLE = b"idle"
BUSY = b"busy"
_STILL = b"still "
_CONFIRM = b"confirm "


def still(round_no: int) -> bytes:
    """A child's answer: idle since its `idle`, checked again after round `round_no`'s question."""
    return _STILL + str(round_no).encode()


def confirm(round_no: int) -> bytes:
    """The supervisor's question of round `round_no`."""
    return _CONFIRM + str(round_no).encode()


def confirm_round(message: bytes) -> int | None:
    """The round a `confirm` message asks about; None for anything else."""
    return _number_after(_CONFIRM, message)


def _number_after(prefix: bytes, message: bytes) -> int | None:
    if not message.startswith(prefix):
        return None
    digits = message[len(prefix):]
    return int(digits) if digits.isdigit() else None


@dataclass(frozen=True)
class Ask:
    """Send `confirm(round_no)` to each of `children`."""

    round_no: int
    children: tuple[int, ...]


@dataclass(frozen=True)
class Agreed:
    """Every child confirmed: the processes are idle together; stop them."""


@dataclass
class IdleAgreement:
    """The supervisor's view of its children, by child number: which run, which are idle,
    and the round of questions under way."""

    # Every child the command has (1..N): all must be running and idle to agree.
    children: frozenset[int]
    running: set[int] = field(default_factory=set)
    idle: set[int] = field(default_factory=set)
    round_no: int = 0
    # The children whose answer to the current round is still to come (None: no round).
    waiting: set[int] | None = None

    def started(self, child: int) -> None:
        """A child (re)started: it says `idle` once its own check finds it so."""
        self.running.add(child)
        self.idle.discard(child)
        self.waiting = None

    def ended(self, child: int) -> None:
        """A child ended: its partitions move to the others, so the round is off."""
        self.running.discard(child)
        self.idle.discard(child)
        self.waiting = None

    def heard(self, child: int, message: bytes) -> Ask | Agreed | None:
        """What to do about one message from `child`."""
        if child not in self.running:
            return None
        if message == IDLE:
            self.idle.add(child)
            return self._ask()
        if message == BUSY:
            self.idle.discard(child)
            self.waiting = None
            return None
        answered = _number_after(_STILL, message)
        if (answered is None or answered != self.round_no or self.waiting is None
                or child not in self.idle):
            return None  # an answer to a round already called off
        self.waiting.discard(child)
        return None if self.waiting else Agreed()

    def _ask(self) -> Ask | None:
        if self.waiting is not None or self.running != set(self.children) \
                or not self.idle >= self.children:
            return None
        self.round_no += 1
        self.waiting = set(self.children)
        return Ask(self.round_no, tuple(sorted(self.children)))


__all__ = ["BUSY", "IDLE", "Agreed", "Ask", "IdleAgreement", "confirm", "confirm_round",
           "still"]
