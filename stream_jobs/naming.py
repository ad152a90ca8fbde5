"""Topic and consumer-group names (the contract in DESIGN.md). Pure functions.

For job type `T` and prefix `P` (default `jobs`):
lanes `P.T`, `P.T.high`, `P.T.low`; tiers `P.T.retry-5s`...; dead letters `P.T.dlq`;
with `[fairness]`, the overflow lane of noisy tenants' jobs `P.T.overflow`;
groups `P.T.worker`, `P.T.relay`, `P.T.dlq`, and `P.T.shadow` for shadow mode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from stream_jobs.errors import ConfigError

DEFAULT_LANE = "default"
LANES = ("high", "default", "low")
TopicRole = Literal["lane", "tier", "dlq", "overflow"]

# A dotted type name: segments of lowercase letters, digits, '_' and '-'.
_TYPE = re.compile(r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*$")
_RESERVED_SUFFIXES = ("high", "low", "dlq", "worker", "relay", "overflow")
MAX_TOPIC_LENGTH = 249


def validate_job_type(job_type: str) -> str:
    """`job_type` if it is a valid dotted name; else ConfigError saying why."""
    if not _TYPE.match(job_type):
        raise ConfigError(
            f"{job_type!r} is not a job type name: use dotted lowercase words such as "
            "'email.send' (letters, digits, '_' and '-')."
        )
    last = job_type.rsplit(".", 1)[-1]
    if last in _RESERVED_SUFFIXES or last.startswith("retry-"):
        raise ConfigError(f"{job_type!r} ends in {last!r}, which names a lane, tier or group.")
    return job_type


def lane_topic(prefix: str, job_type: str, lane: str = DEFAULT_LANE) -> str:
    if lane not in LANES:
        raise ConfigError(f"{lane!r} is not a priority lane; use one of {', '.join(LANES)}.")
    base = f"{prefix}.{job_type}"
    return base if lane == DEFAULT_LANE else f"{base}.{lane}"


def tier_topic(prefix: str, job_type: str, tier: str) -> str:
    """The delay tier topic, `tier` spelled as in the TOML ("5s", "1m")."""
    return f"{prefix}.{job_type}.retry-{tier}"


def dlq_topic(prefix: str, job_type: str) -> str:
    return f"{prefix}.{job_type}.dlq"


def overflow_topic(prefix: str, job_type: str) -> str:
    """Where a type with `[fairness]` moves a noisy tenant's jobs (docs/fairness.md): read
    by the type's workers like a lane, with a bounded share of their slots."""
    return f"{prefix}.{job_type}.overflow"


def stats_topic(prefix: str) -> str:
    """Where workers publish their outcome counters (`stream-jobs stats` reads it).

    A type name cannot start with '_', so this never clashes with a type's topics.
    """
    return f"{prefix}._stats"


# `P._stats` keeps a day of reports: enough for `stats` and for a new history process to
# fold the last day.
STATS_TOPIC_CONFIG = {"retention.ms": str(24 * 3600 * 1000)}


def control_topic(prefix: str) -> str:
    """Operators' run-time settings per type (`stream-jobs throttle`), compacted by type.

    Like `P._stats`, it cannot clash with a type's topics.
    """
    return f"{prefix}._control"


def history_app_id(prefix: str) -> str:
    """The history process's faust-streaming app: its group, its transactional IDs, and
    the start of its own topics' names (`P._history-minutes-changelog`, ...).

    Like `P._stats`, it cannot clash with a type's topics.
    """
    return f"{prefix}._history"


def history_topic(prefix: str) -> str:
    """Where the history process writes each window's tally as it changes (compacted by
    window, read committed into `stream_jobs_history`)."""
    return f"{prefix}._history.windows"


def worker_group(prefix: str, job_type: str) -> str:
    return f"{prefix}.{job_type}.worker"


def relay_group(prefix: str, job_type: str) -> str:
    return f"{prefix}.{job_type}.relay"


def dlq_group(prefix: str, job_type: str) -> str:
    return f"{prefix}.{job_type}.dlq"


def shadow_group(prefix: str, job_type: str) -> str:
    """The group `worker --shadow` reads the lanes with: it counts, runs nothing, and never
    moves the offsets of `P.T.worker`."""
    return f"{prefix}.{job_type}.shadow"


@dataclass(frozen=True)
class TopicRef:
    """What a topic name means: its type, its role, and the lane or tier."""

    job_type: str
    role: TopicRole
    lane: str = DEFAULT_LANE
    tier: str | None = None


def parse_topic(prefix: str, topic: str) -> TopicRef:
    """The inverse of the naming functions. Raises ConfigError for a name not ours."""
    head = f"{prefix}."
    if not topic.startswith(head):
        raise ConfigError(f"Topic {topic!r} does not start with the prefix {prefix!r}.")
    rest = topic[len(head):]
    body, _, last = rest.rpartition(".")
    if body and last in ("high", "low"):
        return TopicRef(validate_job_type(body), "lane", lane=last)
    if body and last == "dlq":
        return TopicRef(validate_job_type(body), "dlq")
    if body and last == "overflow":
        return TopicRef(validate_job_type(body), "overflow")
    if body and last.startswith("retry-") and len(last) > len("retry-"):
        return TopicRef(validate_job_type(body), "tier", tier=last[len("retry-"):])
    return TopicRef(validate_job_type(rest), "lane")
