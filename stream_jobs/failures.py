"""A job's last failure, as the `sj-error` header carries it. Pure.

Built from the exception a run ended with: its class, its message (cut to 1,000
characters) and the end of its traceback (cut to 4,000), with a reason code from
`stream_jobs.outcomes.Reason`. Anything unprintable or not UTF-8 is replaced, never
raised: describing a failure must not cost the dead letter.

A failed run also says which worker ran it (`worker_id`, as its reports name it), when
the run started and how long it ran (`started_at_ms`, `duration_ms`). These are optional:
a header written before they existed, or a failure without a run (a payload that does
not fit its model), parses with them None.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import TypeGuard

import orjson

MAX_MESSAGE_CHARS = 1_000
MAX_TRACEBACK_CHARS = 4_000


@dataclass(frozen=True, slots=True)
class FailureInfo:
    """The last failure of a job, carried in the `sj-error` header as a JSON object."""

    reason: str
    error_class: str
    message: str
    traceback: str
    failed_at_ms: int
    worker_id: str | None = None
    started_at_ms: int | None = None
    duration_ms: int | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, reason: str, now_ms: int, *,
                       worker_id: str | None = None, started_at_ms: int | None = None
                       ) -> FailureInfo:
        """Describe `exc`, with the message cut to 1,000 chars and the traceback to 4,000;
        of a run, the worker that ran it and when it started (its duration runs to `now_ms`).

        The traceback keeps its last lines: that is where the error was raised.
        """
        kind = type(exc)
        name = kind.__qualname__
        if kind.__module__ != "builtins":
            name = f"{kind.__module__}.{name}"
        try:
            message = str(exc)
        except Exception:  # a broken __str__ must not cost us the dead letter
            message = f"<{name} with an unprintable message>"
        try:
            trace = "".join(traceback.format_exception(exc))
        except Exception:
            trace = ""
        return cls(
            reason=reason,
            error_class=_clean(name),
            message=_clip_head(_clean(message), MAX_MESSAGE_CHARS),
            traceback=_clip_tail_lines(_clean(trace), MAX_TRACEBACK_CHARS),
            failed_at_ms=now_ms,
            worker_id=None if worker_id is None else _clean(worker_id),
            started_at_ms=started_at_ms,
            duration_ms=None if started_at_ms is None else max(0, now_ms - started_at_ms),
        )

    def to_json(self) -> bytes:
        fields: dict[str, str | int] = {
            "reason": self.reason,
            "error_class": self.error_class,
            "message": self.message,
            "traceback": self.traceback,
            "failed_at_ms": self.failed_at_ms,
        }
        # Only what is known: a failure without a run keeps the header as it was.
        for name, value in (("worker_id", self.worker_id),
                            ("started_at_ms", self.started_at_ms),
                            ("duration_ms", self.duration_ms)):
            if value is not None:
                fields[name] = value
        try:
            return orjson.dumps(fields)
        except TypeError:
            # Lone surrogates (from surrogateescape-decoded text) are not UTF-8.
            return orjson.dumps(
                {k: _clean(v) if isinstance(v, str) else v for k, v in fields.items()}
            )

    @classmethod
    def from_json(cls, raw: bytes) -> FailureInfo:
        """Parse `to_json` output. Raises ValueError if it is not one; see `parse_failure`."""
        obj = orjson.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("a failure is a JSON object")
        texts = {}
        for name in ("reason", "error_class", "message", "traceback"):
            value = obj.get(name)
            if not isinstance(value, str):
                raise ValueError(f"failure field {name!r} is not a string")
            texts[name] = value
        failed_at_ms = obj.get("failed_at_ms")
        if not _is_int(failed_at_ms):
            raise ValueError("failure field 'failed_at_ms' is not an integer")
        worker_id = obj.get("worker_id")
        started_at_ms, duration_ms = obj.get("started_at_ms"), obj.get("duration_ms")
        # The optional fields of a run: one that is not what it should be is left out.
        return cls(failed_at_ms=failed_at_ms, **texts,
                   worker_id=worker_id if isinstance(worker_id, str) else None,
                   started_at_ms=started_at_ms if _is_int(started_at_ms) else None,
                   duration_ms=duration_ms if _is_int(duration_ms) else None)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_failure(raw: bytes | None) -> FailureInfo | None:
    """The failure in an `sj-error` header, or None if absent or garbled. Never raises.

    A garbled error header only loses the history of a job, so it is not worth
    dead-lettering the job for.
    """
    if raw is None:
        return None
    try:
        return FailureInfo.from_json(raw)
    except Exception:
        return None


def _clean(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def _clip_head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clip_tail_lines(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = "…\n"  # shows the reader that the top of the traceback was cut
    budget = limit - len(marker)
    kept: list[str] = []
    size = 0
    for line in reversed(text.splitlines(keepends=True)):
        if size + len(line) > budget:
            break
        kept.append(line)
        size += len(line)
    if not kept:  # the last line alone is too long: keep its end
        return marker + text[-budget:]
    return marker + "".join(reversed(kept))
