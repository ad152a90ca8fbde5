"""The cursor of a list of waiting jobs: where the next page starts. Pure.

A cursor is opaque and URL-safe. For the lanes and the delay tiers it holds the next
offset of each partition read so far (a keyset: a page costs a page, whatever the
backlog); for the dead jobs, the place of the last job shown. It also counts the rows
shown before it ("51 to 100 of 100,000"). A check sum over the type, the list and the
contents makes a cursor edited by hand, cut short or carried to another type's list a
`BadCursor`, never a wrong page. It is a check, not a secret: a cursor only ever points
at records anyone who may see the list may read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from stream_jobs.errors import BadCursor, ConfigError

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_CURSOR_CHARS = 16_384
_CHECK_BYTES = 8
_CHECK_KEY = b"stream-jobs waiting cursor v1"

Slot = tuple[str, int]  # (lane or tier name, partition)


@dataclass(frozen=True)
class Cursor:
    """Where a page starts: `positions`, the next offset per (lane or tier, partition)
    (a slot not named starts at its group's committed offset); `after`, the dead list's
    place of the last job shown; `shown`, the rows on the pages before."""

    state: str
    shown: int = 0
    positions: Mapping[Slot, int] = field(default_factory=dict)
    after: tuple[int, int, int] | None = None


def page_size(raw: str | int | None) -> int:
    """The page size asked for (DEFAULT_PAGE_SIZE when not), or ConfigError."""
    if raw is None or raw == "":
        return DEFAULT_PAGE_SIZE
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ConfigError(f"A page holds 1 to {MAX_PAGE_SIZE} jobs; {raw!r} is not such a "
                          "number.")
    return size


def encode(cursor: Cursor, job_type: str) -> str:
    """The cursor as URL-safe text, bound to `job_type` and its list."""
    body = orjson.dumps([cursor.state, cursor.shown,
                         list(cursor.after) if cursor.after is not None else None,
                         [[name, part, offset] for (name, part), offset
                          in sorted(cursor.positions.items())]])
    return f"{_b64(body)}.{_b64(_check(job_type, body))}"


def decode(text: str, job_type: str, state: str) -> Cursor:
    """The cursor in `text` if this list (`job_type`, `state`) gave it out; else BadCursor."""
    if len(text) > MAX_CURSOR_CHARS or text.count(".") != 1:
        raise _bad()
    encoded_body, encoded_check = text.split(".")
    try:
        body, check = _unb64(encoded_body), _unb64(encoded_check)
    except (binascii.Error, ValueError) as exc:
        raise _bad() from exc
    # Only the one spelling `encode` gives: base64's spare bits and padding may not vary.
    if check != _check(job_type, body) or f"{_b64(body)}.{_b64(check)}" != text:
        raise _bad()
    try:
        found_state, shown, after, positions = orjson.loads(body)
        cursor = Cursor(found_state, _count(shown), _positions(positions), _after(after))
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise _bad() from exc
    if cursor.state != state:
        raise _bad()
    return cursor


def _bad() -> BadCursor:
    return BadCursor("This page's cursor is not one this list gave out (it was cut short, "
                     "edited, or belongs to another list): start again from the first page.")


def _check(job_type: str, body: bytes) -> bytes:
    return hashlib.blake2b(job_type.encode() + b"\0" + body, key=_CHECK_KEY,
                           digest_size=_CHECK_BYTES).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _count(value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError("not a count")
    return value


def _positions(value: object) -> dict[Slot, int]:
    if not isinstance(value, list):
        raise ValueError("not a list of positions")
    found: dict[Slot, int] = {}
    for item in value:
        name, part, offset = item
        if not isinstance(name, str):
            raise ValueError("not a lane or tier name")
        found[(name, _count(part))] = _count(offset)
    return found


def _after(value: object) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError("not a place")
    return (_count(value[0]), _count(value[1]), _count(value[2]))


__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "Cursor", "Slot", "decode", "encode",
           "page_size"]
