"""Durations and rates as users write them in topics/*.toml and on the command line.

"5s", "1m", "10m", "1h", "7d", "250ms"; rates as "200/s", "50/m". Pure functions.
"""

from __future__ import annotations

import math
import re

from stream_jobs.errors import ConfigError

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")


def parse_duration(text: str | int | float) -> float:
    """Seconds in `text` ("5s", "1m", "7d"); a bare number is seconds. Raises ConfigError."""
    if isinstance(text, bool):
        raise ConfigError(f"{text!r} is not a duration; write e.g. '5s', '1m' or '7d'.")
    if isinstance(text, int | float):
        try:
            seconds = float(text)
        except OverflowError:  # an int past any float
            seconds = math.inf
    else:
        match = _DURATION.match(text)
        if match is None:
            raise ConfigError(f"{_shown(text)} is not a duration; write e.g. '5s', '1m' or "
                              "'7d'.")
        seconds = float(match.group(1)) * _UNITS_S[match.group(2)]
    if not math.isfinite(seconds):
        # NaN or infinity (or digits past any float): every comparison and sum of it lies.
        raise ConfigError(f"{_shown(text)} is not a finite duration; write e.g. '5s', '1m' "
                          "or '7d'.")
    if seconds < 0:
        raise ConfigError(f"{_shown(text)} is negative; a duration is zero or more.")
    return seconds


def _shown(text: str | int | float) -> str:
    shown = repr(text)  # quoted short: a megabyte of digits is no help in a message
    return shown if len(shown) <= 40 else shown[:37] + "..."


def format_duration(seconds: float) -> str:
    """The shortest exact spelling: 5 -> "5s", 60 -> "1m", 600 -> "10m", 0.25 -> "250ms"."""
    if seconds > 0 and seconds < 1:
        return f"{round(seconds * 1000)}ms"
    for unit in ("w", "d", "h", "m"):
        size = _UNITS_S[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds}s"


def parse_rate(text: str) -> float:
    """Events per second in `text` ("200/s", "50/m"). Raises ConfigError."""
    match = _RATE.match(text)
    if match is None:
        raise ConfigError(f"{text!r} is not a rate; write e.g. '200/s' or '50/m'.")
    per_s = float(match.group(1)) / _UNITS_S[match.group(2)]
    if per_s <= 0:
        raise ConfigError(f"{text!r} is not a positive rate.")
    return per_s
