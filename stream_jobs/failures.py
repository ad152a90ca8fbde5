"""A job's last failure, as the `sj-error` header carries it. Pure.

Built from the exception a run ended with: its class, its message (cut to 1,000
characters) and the end of its traceback (cut to 4,000), with a reason code from
`stream_jobs.outcomes.Reason`. Anything unprintable or not UTF-8 is replaced, never
raised: describing a failure must not cost the dead letter.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

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

    @classmethod
    def from_exception(cls, exc: BaseException, reason: str, now_ms: int) -> FailureInfo:
        """Describe `exc`, with the message cut to 1,000 chars and the traceback to 4,000.

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
        )

    def to_json(self) -> bytes:
        fields = {
            "reason": self.reason,
            "error_class": self.error_class,
            "message": self.message,
            "traceback": self.traceback,
            "failed_at_ms": self.failed_at_ms,
        }
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
        if not isinstance(failed_at_ms, int) or isinstance(failed_at_ms, bool):
            raise ValueError("failure field 'failed_at_ms' is not an integer")
        return cls(failed_at_ms=failed_at_ms, **texts)


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
