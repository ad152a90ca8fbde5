"""The keys of a job type's TOML (`topics/T.toml`): each read, type-checked and normalised,
with one sentence naming the key when it is wrong. Pure; `stream_jobs.job_types` builds
the policy from them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TypeVar

from stream_jobs.durations import format_duration, parse_duration, parse_rate
from stream_jobs.errors import ConfigError
from stream_jobs.lanes import DEFAULT_LANE_WEIGHTS
from stream_jobs.naming import DEFAULT_LANE, LANES
from stream_jobs.periodic import parse_schedules
from stream_jobs.tenants import FairnessSpec

KNOWN_KEYS = (
    "type",
    "partitions",
    "replication_factor",
    "retention",
    "retry_tiers",
    "max_attempts",
    "priorities",
    "lane_weights",
    "expires_in",
    "rate_limit",
    "heartbeat_interval",
    "max_payload_bytes",
    "schedules",
    "redact",
    "fairness",
)


def read_key(key: str, raw: object) -> dict[str, object]:
    """The constructor argument(s) for one TOML key, with the value's type checked."""
    if key in ("partitions", "replication_factor", "max_attempts", "max_payload_bytes"):
        return {key: positive_int(key, raw)}
    if key == "retention":
        return {"retention_s": _duration(key, raw)}
    if key == "expires_in":
        return {"expires_in_s": _duration(key, raw)}
    if key == "rate_limit":
        if not isinstance(raw, str):
            raise invalid(key, f"must be a rate such as '200/s', not {raw!r}")
        return {"rate_limit_per_s": _wrapped(key, parse_rate, raw)}
    if key == "retry_tiers":
        return {"retry_tiers": tuple(_list_of(key, raw, (str, int, float)))}
    if key == "priorities":
        return {"priorities": tuple(_list_of(key, raw, (str,)))}
    if key == "lane_weights":
        if not isinstance(raw, dict):
            raise invalid(key, f"must be a table such as {{high = 6, default = 3, low = 1}}, "
                                f"not {raw!r}")
        return {"lane_weights": tuple((str(lane), positive_int(f"lane_weights.{lane}", w))
                                      for lane, w in raw.items())}
    if key == "heartbeat_interval":
        return {"heartbeat_interval_s": _duration(key, raw)}
    if key == "schedules":
        return {"schedules": parse_schedules(raw)}
    if key == "redact":
        return {"redact": _field_paths(key, raw)}
    if key == "fairness":
        return {"fairness": FairnessSpec.from_toml(raw)}
    raise ConfigError(unknown_key(key))


def unknown_key(key: str) -> str:
    close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; known keys are {', '.join(KNOWN_KEYS)}."


def invalid(key: str, problem: str) -> ConfigError:
    return ConfigError(f"{key!r} {problem}.")


def positive_int(key: str, value: object) -> int:
    # bool is an int in Python; `partitions = true` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(key, f"must be a whole number of 1 or more, not {value!r}")
    return value


_Raw = TypeVar("_Raw")


def _wrapped(key: str, parse: Callable[[_Raw], float], raw: _Raw) -> float:
    try:
        return parse(raw)
    except ConfigError as exc:
        raise ConfigError(f"{key!r}: {exc}") from exc


def _duration(key: str, raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise invalid(key, f"must be a duration such as '7d', not {raw!r}")
    return _wrapped(key, parse_duration, raw)


def _list_of(key: str, raw: object, kinds: tuple[type, ...]) -> list[object]:
    if not isinstance(raw, list) or any(
        isinstance(item, bool) or not isinstance(item, kinds) for item in raw
    ):
        example = '["5s", "1m", "10m"]' if key == "retry_tiers" else '["high", "default"]'
        raise invalid(key, f"must be a list such as {example}, not {raw!r}")
    return list(raw)


def _field_paths(key: str, raw: object) -> tuple[str, ...]:
    """Field names, dotted paths into nested objects: `["card_number", "customer.ssn"]`."""
    if not isinstance(raw, list) or not all(
            isinstance(p, str) and p and all(p.split(".")) for p in raw):
        raise invalid(key, 'must be a list of field names, dotted into nested objects, '
                            f'such as ["card_number", "customer.ssn"], not {raw!r}')
    return tuple(raw)


def normal_tiers(tiers: tuple[object, ...]) -> tuple[str, ...]:
    if not tiers:
        raise invalid("retry_tiers", "needs at least one tier, e.g. [\"5s\"]")
    names: list[str] = []
    delays: list[float] = []
    for tier in tiers:
        if isinstance(tier, bool) or not isinstance(tier, str | int | float):
            raise invalid("retry_tiers", f"has {tier!r}, which is not a duration")
        delay = _wrapped("retry_tiers", parse_duration, tier)
        name = format_duration(delay)
        # The name becomes part of a topic name that must parse back to the same delay.
        if delay <= 0 or "." in name or parse_duration(name) != delay:
            raise invalid(
                "retry_tiers",
                f"has {tier!r}: a tier is a whole number of ms, s, m, h or d above zero",
            )
        if delays and delay <= delays[-1]:
            raise invalid(
                "retry_tiers",
                f"must be strictly increasing; {name} follows {names[-1]}",
            )
        names.append(name)
        delays.append(delay)
    return tuple(names)


def normal_priorities(priorities: tuple[str, ...]) -> tuple[str, ...]:
    for lane in priorities:
        if lane not in LANES:
            raise invalid("priorities", f"has {lane!r}; lanes are {', '.join(LANES)}")
    duplicated = sorted({lane for lane in priorities if priorities.count(lane) > 1})
    if duplicated:
        raise invalid("priorities", f"names {duplicated[0]!r} twice")
    if DEFAULT_LANE not in priorities:
        # Jobs enqueued without a priority, and the relay's default route, land there.
        raise invalid("priorities", f"must include {DEFAULT_LANE!r}")
    return tuple(lane for lane in LANES if lane in priorities)


def normal_weights(weights: tuple[tuple[str, int], ...],
                    priorities: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    given: dict[str, int] = {}
    for lane, weight in weights:
        if lane not in LANES:
            raise invalid("lane_weights", f"has {lane!r}; lanes are {', '.join(LANES)}")
        if lane not in priorities:
            raise invalid("lane_weights", f"weighs {lane!r}, which 'priorities' does not "
                                           f"declare ({', '.join(priorities)})")
        positive_int(f"lane_weights.{lane}", weight)
        given[lane] = weight
    return tuple((lane, given.get(lane, DEFAULT_LANE_WEIGHTS[lane])) for lane in priorities)
