"""Job IDs: time-ordered UUIDv7 strings, and which IDs and keys can be accepted. Pure.

A job ID is the dedup key (`stream_jobs_done.job_id`), a log field, a CLI argument and a
path segment of the gateway's routes. The producer may choose its own; whoever made it,
it is at most `MAX_JOB_ID_CHARS` characters and holds no control character
(`control_character`): the client refuses such an ID, the decoder dead-letters a record
carrying one (`bad-header`), and the dedup column is that wide. The client also refuses
an ID with a `/`, which no route of the gateway could name (`checked_job_id`); a record
from another producer may carry one, and only HTTP cannot address it.

A key given as text (`key=`, `unique_key=`, a debounce key) is shown the same ways and
holds no control character either (`checked_key`); a key given as bytes is the record's
key as it is, binary by contract, and is not read as text.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Callable

from stream_jobs import clock
from stream_jobs.errors import ConfigError

# The one limit: the client's, the decoder's and the dedup column's.
MAX_JOB_ID_CHARS = 64
# UTF-8 spends at most 4 bytes on a character: a header longer than this is refused
# before it is decoded.
MAX_JOB_ID_BYTES = 4 * MAX_JOB_ID_CHARS

# What a log line, a page or a terminal would read as something other than a character:
# C0 (U+0000-U+001F), DEL, C1 (U+0080-U+009F, with NEL U+0085), and the Unicode line and
# paragraph separators, which str.splitlines() and some viewers break lines at.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

_UUID7 = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", re.IGNORECASE
)
# Random bytes per job ID, and IDs' worth fetched per os.urandom call.
_ID_RANDOM_BYTES = 10
ID_RANDOM_CHUNK = 256


class JobIdSource:
    """UUIDv7 job IDs (RFC 9562), strictly increasing within one source.

    Layout: 48-bit Unix ms | version 7 | 12-bit counter (rand_a) | variant | 62 random bits.
    Within one millisecond the counter increments from a random start below 2048, so
    IDs sort in creation order; if it overflows, or the clock steps back, the source
    keeps counting on its own last millisecond instead of going backwards.

    Random bits come from `os.urandom` in chunks of `ID_RANDOM_CHUNK` IDs: one system call
    per ID was a tenth of `enqueue_many`'s CPU. A forked child drops the chunk it
    inherited, so parent and child never hand out the same bits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = -1
        self._counter = 0
        self._random = b""
        self._used = 0
        forget = weakref.WeakMethod(self._forget_random)
        os.register_at_fork(after_in_child=lambda: _call_if_alive(forget))

    def _forget_random(self) -> None:
        self._random = b""
        self._used = 0

    def next_id(self, now_ms: int) -> str:
        with self._lock:
            used = self._used
            if used >= len(self._random):
                self._random = os.urandom(_ID_RANDOM_BYTES * ID_RANDOM_CHUNK)
                used = 0
            self._used = used + _ID_RANDOM_BYTES
            # 80 bits: 62 for rand_b, 11 to seed the counter.
            rand = int.from_bytes(self._random[used:used + _ID_RANDOM_BYTES], "big")
            if now_ms > self._ms:
                self._ms = now_ms
                self._counter = rand >> 69
            else:
                self._counter += 1
                if self._counter > 0xFFF:
                    self._ms += 1
                    self._counter = 0
            ms, counter = self._ms, self._counter
        value = (
            (ms & 0xFFFF_FFFF_FFFF) << 80
            | 0x7 << 76
            | counter << 64
            | 0b10 << 62
            | rand & 0x3FFF_FFFF_FFFF_FFFF
        )
        text = value.to_bytes(16, "big").hex()
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _call_if_alive(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()


_job_ids = JobIdSource()


def new_job_id() -> str:
    """A fresh UUIDv7 string; IDs from one process sort in the order they were made."""
    return _job_ids.next_id(clock.now_ms())


def job_id_time_ms(job_id: str) -> int | None:
    """The Unix ms a UUIDv7 job ID was made at; None for IDs of any other shape."""
    if not isinstance(job_id, str) or not _UUID7.fullmatch(job_id):
        return None
    return int(job_id[:8] + job_id[9:13], 16)


def control_character(text: str) -> str | None:
    """The first control character in `text` (`CONTROL_CHARACTERS`), or None."""
    found = CONTROL_CHARACTERS.search(text)
    return None if found is None else found.group()


def id_problem(value: str, field: str = "job_id") -> str | None:
    """Why `value` cannot be a job ID given at enqueue (one sentence naming `field`), or
    None when it can."""
    if not value or len(value) > MAX_JOB_ID_CHARS:
        return f"A {field} must be 1 to {MAX_JOB_ID_CHARS} characters."
    return _control_problem(value, field) or (
        None if "/" not in value else
        f"A {field} cannot contain '/': the gateway's routes (/jobs/{{id}}, /ui/jobs/{{id}}) "
        "take the ID as one path segment, which cannot hold one; use another separator, "
        "such as ':'.")


def key_problem(value: str, field: str = "key") -> str | None:
    """Why `value` cannot be a key given as text (one sentence naming `field`), or None."""
    return _control_problem(value, field)


def _control_problem(value: str, field: str) -> str | None:
    try:
        value.encode()
    except UnicodeEncodeError:
        # A lone surrogate: no record header, key or table row can hold it.
        return f"A {field} must be valid UTF-8 text (it holds a lone surrogate)."
    char = control_character(value)
    if char is None:
        return None
    return (f"A {field} cannot contain the control character U+{ord(char):04X}: IDs and keys "
            "are shown in log lines, pages and terminals, where one could forge or break a "
            "line; use printable characters.")


def checked_job_id(value: str, field: str = "job_id") -> str:
    """`value`, or `ConfigError` with `id_problem`'s sentence."""
    problem = id_problem(value, field)
    if problem is not None:
        raise ConfigError(problem)
    return value


def checked_key(value: str, field: str = "key") -> str:
    """`value`, or `ConfigError` with `key_problem`'s sentence."""
    problem = key_problem(value, field)
    if problem is not None:
        raise ConfigError(problem)
    return value
