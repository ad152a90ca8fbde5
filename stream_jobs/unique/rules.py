"""Unique jobs and debounce: what an enqueue asks for, checked, and what it was told. Pure.

`enqueue(..., unique_key="digest:user-42", unique_for="10m")`: while a job holding the
key is pending (enqueued, not finished) or within `unique_for` of its enqueue, another
enqueue with the key sends nothing and is told the holder's job ID. The key is taken in
the same Postgres transaction as the job's outbox row, so two producers racing on it
cannot both send (`stream_jobs.unique.claim`); the worker gives it back when the job
finishes, whatever the outcome (`stream_jobs.unique.release`).

`enqueue(..., key=doc_id, debounce="30s")`: the first job of a key opens a window of that
length; every job of the key enqueued inside it waits until the window ends, and only the
last of them runs (the others finish as `superseded`). A window opened by the first job,
not restarted by each new one, bounds the wait: a key enqueued without pause still runs
once per window instead of never.

The answer is an `Enqueued`: a `str` (the job ID, as every enqueue returns) that also
says whether this call sent the job and, for debounce, which job it superseded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from stream_jobs.durations import parse_duration
from stream_jobs.errors import ConfigError
from stream_jobs.job_ids import checked_key

# A key is a primary-key column; longer keys are a mistake (hash them yourself).
MAX_KEY_CHARS = 255
# A debounce window runs the job late by up to its length: more than a day is a schedule.
MAX_DEBOUNCE_S = 86_400.0
# A key held longer is held for good in all but name; Postgres' intervals end, too.
MAX_UNIQUE_FOR_S = 100 * 365 * 86_400.0

Window = float | int | str | timedelta


@dataclass(frozen=True, slots=True)
class KeyClaim:
    """What an enqueue asks of its key: hold it (`unique`) or debounce on it."""

    kind: Literal["unique", "debounce"]
    key: str
    # unique: seconds the key stays held after the enqueue even once the job finished
    # (None: only while it is pending). debounce: the window's length.
    window_s: float | None


class Enqueued(str):
    """The job ID an enqueue with `unique_key` or `debounce` returns, and what happened.

    It is the ID itself (a `str`), so code that only wants the ID needs nothing new.
    `sent` is False when a pending job held the unique key: nothing was sent, and this is
    the holder's ID. `superseded` is, for debounce, the earlier job of the window that
    this one replaced (it will finish as `superseded`), or None when this job opened the
    window. `not_before_ms` is when a debounced job may run (its window's end).
    """

    __slots__ = ("not_before_ms", "sent", "superseded")

    sent: bool
    superseded: str | None
    not_before_ms: int | None

    def __new__(cls, job_id: str, *, sent: bool, superseded: str | None = None,
                not_before_ms: int | None = None) -> Enqueued:
        made = super().__new__(cls, job_id)
        made.sent = sent
        made.superseded = superseded
        made.not_before_ms = not_before_ms
        return made

    def __repr__(self) -> str:
        extra = f", superseded={self.superseded!r}" if self.superseded else ""
        return f"Enqueued({str(self)!r}, sent={self.sent}{extra})"


def _seconds(value: Window, what: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        seconds = parse_duration(value)
    else:
        raise ConfigError(f"{what} is a duration such as '10m' or 600, not {value!r}.")
    if seconds < 0:
        raise ConfigError(f"{what} must not be negative.")
    return seconds


def _checked_key(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} must be a non-empty string.")
    if len(value) > MAX_KEY_CHARS:
        raise ConfigError(f"{what} is {len(value)} characters, over the limit of "
                          f"{MAX_KEY_CHARS}: hash a longer key into one.")
    return checked_key(value, what)


def key_claim(*, unique_key: str | None, unique_for: Window | None, debounce: Window | None,
              key: str | bytes | None, delay: object = None,
              run_at: datetime | None = None) -> KeyClaim | None:
    """The claim an enqueue's arguments make, or None for a plain enqueue; `ConfigError`
    (one sentence) for a combination that cannot mean anything."""
    if unique_key is None and unique_for is None and debounce is None:
        return None
    if debounce is not None:
        if unique_for is not None:
            raise ConfigError("Give unique_for or debounce, not both: a debounced key runs "
                              "the last job of each window, a unique key the first.")
        if delay is not None or run_at is not None:
            raise ConfigError("A debounced job runs when its window ends: give debounce "
                              "without delay or run_at.")
        window_s = _seconds(debounce, "debounce")
        if not 0 < window_s <= MAX_DEBOUNCE_S:
            raise ConfigError(f"debounce must be more than 0 s and at most a day "
                              f"({MAX_DEBOUNCE_S:g} s).")
        if unique_key is not None:
            return KeyClaim("debounce", _checked_key(unique_key, "unique_key"), window_s)
        if key is None:
            raise ConfigError("debounce needs a key to debounce on: give key= (or "
                              "unique_key=).")
        try:
            text = key.decode() if isinstance(key, bytes) else key
        except UnicodeDecodeError:
            raise ConfigError("A debounce key given as bytes must be UTF-8 text; give "
                              "unique_key= as a string.") from None
        return KeyClaim("debounce", _checked_key(text, "key"), window_s)
    if unique_key is None:
        raise ConfigError("unique_for needs a unique_key to hold.")
    window = None if unique_for is None else _seconds(unique_for, "unique_for")
    if window is not None and window > MAX_UNIQUE_FOR_S:
        raise ConfigError(f"unique_for is at most 100 years ({MAX_UNIQUE_FOR_S:.0f} s); "
                          "leave it out to hold the key only while the job is pending.")
    return KeyClaim("unique", _checked_key(unique_key, "unique_key"), window)


__all__ = ["MAX_KEY_CHARS", "Enqueued", "KeyClaim", "key_claim"]
