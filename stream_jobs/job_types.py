"""Job types as declared in `topics/<type>.toml`, and the Kafka topics each one needs. Pure.

A file's stem names its type unless the file sets `type`. Every key is optional:

    partitions = 12                    # per lane; tiers and the DLQ get as many
    replication_factor = 1             # 3 in production
    retention = "7d"                   # lanes and tiers; the DLQ keeps 4x as long
    retry_tiers = ["5s", "1m", "10m"]  # delay tiers, strictly increasing
    max_attempts = 4                   # attempts in all, the first included
    priorities = ["high", "default", "low"]
    lane_weights = {high = 6, default = 3, low = 1}   # dispatch slots per lane under load
    expires_in = "1h"                  # optional default expiry of a job
    rate_limit = "200/s"               # optional, across all workers of the type
    heartbeat_interval = "5s"          # optional, heartbeats through every lane partition
    max_payload_bytes = 65536          # optional, below the global setting

    [fairness]                         # optional: fair dispatch across tenants, the
    tenant_concurrency = 10            # overflow lane (keys: stream_jobs.tenants)

    [[schedules]]                      # optional, any number: periodic jobs of the type
    name = "nightly"                   # (keys: stream_jobs.periodic)
    cron = "0 3 * * *"

`stream_jobs.topic_plan` compares a type's topics with what the broker reports, and
`stream_jobs.kafka.topics` makes the broker match.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from stream_jobs.durations import format_duration, parse_duration, parse_rate
from stream_jobs.errors import ConfigError, UnknownJobType
from stream_jobs.lanes import DEFAULT_LANE_WEIGHTS
from stream_jobs.naming import (
    DEFAULT_LANE,
    LANES,
    MAX_TOPIC_LENGTH,
    TopicRole,
    lane_topic,
    overflow_topic,
    tier_topic,
    validate_job_type,
)
from stream_jobs.naming import dlq_topic as _dlq_topic
from stream_jobs.periodic import ScheduleSpec, parse_schedules
from stream_jobs.settings import Settings
from stream_jobs.tenants import FairnessSpec

# Every topic gets room for a 1 MiB payload plus key and headers, whatever the broker's default.
MAX_MESSAGE_BYTES = 2_097_152
# Kept free inside a record for the key and the headers (IDs, times, origin, last error).
RECORD_OVERHEAD_BYTES = 65_536
# Dead letters are read later, by a person, often after the incident: keep them longer.
DLQ_RETENTION_FACTOR = 4
# With 3 replicas, acks=all then survives one broker down without refusing writes.
MIN_INSYNC_FROM_REPLICAS = 3

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
# Heartbeats more often than this would be traffic, not a signal.
MIN_HEARTBEAT_INTERVAL_S = 0.1


@dataclass(frozen=True)
class TopicSpec:
    """One topic as Kafka should have it: name, partitions, replicas and topic configs."""

    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str]
    job_type: str = ""
    role: TopicRole = "lane"


@dataclass(frozen=True)
class JobTypePolicy:
    """A job type's policy. Construction validates and normalises (tiers "60s" -> "1m",
    priorities in `naming.LANES` order); a bad value raises ConfigError naming its TOML key.
    """

    job_type: str
    partitions: int = 12
    replication_factor: int = 1
    retention_s: float = 7 * 86_400.0
    retry_tiers: tuple[str, ...] = ("5s", "1m", "10m")
    max_attempts: int = 4
    priorities: tuple[str, ...] = (DEFAULT_LANE,)
    # (lane, weight) for every declared lane, in `priorities` order; lanes not given get
    # `lanes.DEFAULT_LANE_WEIGHTS`.
    lane_weights: tuple[tuple[str, int], ...] = ()
    expires_in_s: float | None = None
    rate_limit_per_s: float | None = None
    heartbeat_interval_s: float | None = None
    max_payload_bytes: int | None = None
    # Periodic jobs declared in the file ([[schedules]]); `stream_jobs.schedules` fires them.
    schedules: tuple[ScheduleSpec, ...] = ()
    # Payload fields masked where an operator sees a payload (`redaction.mask_fields`).
    redact: tuple[str, ...] = ()
    # Fair dispatch across tenants ([fairness], docs/fairness.md); None: jobs in order.
    fairness: FairnessSpec | None = None
    # Where the policy was declared, for messages; not part of the policy itself.
    source: str | None = field(default=None, compare=False)

    def payload_limit(self, settings: Settings) -> int:
        """The most bytes a payload of this type may have: its own `max_payload_bytes`, else
        the setting `STREAM_JOBS_MAX_PAYLOAD_BYTES`."""
        return self.max_payload_bytes or settings.max_payload_bytes

    def __post_init__(self) -> None:
        validate_job_type(self.job_type)
        _positive_int("partitions", self.partitions)
        _positive_int("replication_factor", self.replication_factor)
        _positive_int("max_attempts", self.max_attempts)
        if self.max_payload_bytes is not None:
            _positive_int("max_payload_bytes", self.max_payload_bytes)
            limit = MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES
            if self.max_payload_bytes > limit:
                raise _invalid(
                    "max_payload_bytes",
                    f"must be at most {limit} (a record is capped at {MAX_MESSAGE_BYTES} "
                    "bytes and the key and headers need room too)",
                )
        if not self.retention_s > 0:
            raise _invalid("retention", "must be longer than zero")
        if self.expires_in_s is not None and not self.expires_in_s > 0:
            raise _invalid("expires_in", "must be longer than zero")
        if self.rate_limit_per_s is not None and not self.rate_limit_per_s > 0:
            raise _invalid("rate_limit", "must be a positive rate")
        if (self.heartbeat_interval_s is not None
                and not self.heartbeat_interval_s >= MIN_HEARTBEAT_INTERVAL_S):
            raise _invalid("heartbeat_interval",
                           f"must be at least {format_duration(MIN_HEARTBEAT_INTERVAL_S)}")
        # Normalising here means `JobTypePolicy(...)` in code and a TOML file agree.
        object.__setattr__(self, "retry_tiers", _normal_tiers(self.retry_tiers))
        object.__setattr__(self, "priorities", _normal_priorities(self.priorities))
        object.__setattr__(self, "lane_weights",
                           _normal_weights(self.lane_weights, self.priorities))
        longest = self.tier_delays_s[-1]
        if self.retention_s <= longest:
            # A record waiting in the longest tier would be deleted before it is due.
            raise _invalid(
                "retention",
                f"({format_duration(self.retention_s)}) must be longer than the longest "
                f"retry tier ({self.retry_tiers[-1]})",
            )

    @property
    def origin(self) -> str:
        """The file that declared the type, or a phrase standing in for it."""
        return self.source or f"the policy of {self.job_type!r}"

    @property
    def tier_delays_s(self) -> tuple[float, ...]:
        return tuple(parse_duration(tier) for tier in self.retry_tiers)

    def lane_weight(self, lane: str) -> int:
        """Dispatch slots of `lane` while every lane has work (see `stream_jobs.lanes`)."""
        return dict(self.lane_weights)[lane]

    def lane_topics(self, prefix: str) -> dict[str, str]:
        """Lane -> topic, in `naming.LANES` order (high, default, low)."""
        return {lane: lane_topic(prefix, self.job_type, lane) for lane in self.priorities}

    def worker_topics(self, prefix: str) -> dict[str, str]:
        """What `P.T.worker` reads, by name: the lanes and, with `[fairness]`, the overflow
        lane ("overflow"), which operators see like a lane (stats, waiting, lookup)."""
        topics = self.lane_topics(prefix)
        if self.has_overflow:
            topics["overflow"] = overflow_topic(prefix, self.job_type)
        return topics

    def tier_topics(self, prefix: str) -> dict[str, str]:
        """Tier ("5s") -> topic, shortest delay first."""
        return {tier: tier_topic(prefix, self.job_type, tier) for tier in self.retry_tiers}

    def dlq_topic(self, prefix: str) -> str:
        return _dlq_topic(prefix, self.job_type)

    @property
    def has_overflow(self) -> bool:
        """Whether noisy tenants' jobs move to the type's overflow lane (`[fairness]`)."""
        return self.fairness is not None and self.fairness.overflow

    def all_topics(self, prefix: str) -> list[TopicSpec]:
        """Every topic of the type: lanes, then tiers, then the DLQ.

        Raises ConfigError when a name would exceed Kafka's 249 characters.
        """
        kept = {"retention.ms": _ms(self.retention_s)}
        dead = {"retention.ms": _ms(self.retention_s * DLQ_RETENTION_FACTOR)}
        named: list[tuple[str, TopicRole, dict[str, str]]] = [
            *((name, "lane", kept) for name in self.lane_topics(prefix).values()),
            *((name, "tier", kept) for name in self.tier_topics(prefix).values()),
            (self.dlq_topic(prefix), "dlq", dead),
        ]
        if self.has_overflow:
            named.append((overflow_topic(prefix, self.job_type), "overflow", kept))
        specs = []
        for name, role, retention in named:
            if len(name) > MAX_TOPIC_LENGTH:
                raise ConfigError(
                    f"{self.origin}: topic {name!r} is {len(name)} characters; Kafka allows "
                    f"{MAX_TOPIC_LENGTH}. Use a shorter type name or topic prefix."
                )
            specs.append(
                TopicSpec(name, self.partitions, self.replication_factor,
                          {**retention, **self._common_configs()}, self.job_type, role)
            )
        return specs

    def _common_configs(self) -> dict[str, str]:
        configs = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        if self.replication_factor >= MIN_INSYNC_FROM_REPLICAS:
            configs["min.insync.replicas"] = "2"
        return configs

    @classmethod
    def from_toml(cls, table: Mapping[str, object], *, job_type: str,
                  source: str | None = None) -> JobTypePolicy:
        """The policy in a parsed TOML table (without its `type` key). Raises ConfigError
        naming the key; `source` (the file) prefixes every message."""
        where = f"{source}: " if source else ""
        for key in table:
            if key not in KNOWN_KEYS:
                raise ConfigError(f"{where}{_unknown_key(key)}")
        values: dict[str, object] = {}
        try:
            for key, raw in table.items():
                if key != "type":  # the loader's business: it names the type
                    values.update(_read_key(key, raw))
            return cls(job_type=job_type, source=source, **values)  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(f"{where}{exc}") from exc


def _read_key(key: str, raw: object) -> dict[str, object]:
    """The constructor argument(s) for one TOML key, with the value's type checked."""
    if key in ("partitions", "replication_factor", "max_attempts", "max_payload_bytes"):
        return {key: _positive_int(key, raw)}
    if key == "retention":
        return {"retention_s": _duration(key, raw)}
    if key == "expires_in":
        return {"expires_in_s": _duration(key, raw)}
    if key == "rate_limit":
        if not isinstance(raw, str):
            raise _invalid(key, f"must be a rate such as '200/s', not {raw!r}")
        return {"rate_limit_per_s": _wrapped(key, parse_rate, raw)}
    if key == "retry_tiers":
        return {"retry_tiers": tuple(_list_of(key, raw, (str, int, float)))}
    if key == "priorities":
        return {"priorities": tuple(_list_of(key, raw, (str,)))}
    if key == "lane_weights":
        if not isinstance(raw, dict):
            raise _invalid(key, f"must be a table such as {{high = 6, default = 3, low = 1}}, "
                                f"not {raw!r}")
        return {"lane_weights": tuple((str(lane), _positive_int(f"lane_weights.{lane}", w))
                                      for lane, w in raw.items())}
    if key == "heartbeat_interval":
        return {"heartbeat_interval_s": _duration(key, raw)}
    if key == "schedules":
        return {"schedules": parse_schedules(raw)}
    if key == "redact":
        return {"redact": _field_paths(key, raw)}
    if key == "fairness":
        return {"fairness": FairnessSpec.from_toml(raw)}
    raise ConfigError(_unknown_key(key))


def _unknown_key(key: str) -> str:
    close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; known keys are {', '.join(KNOWN_KEYS)}."


def _invalid(key: str, problem: str) -> ConfigError:
    return ConfigError(f"{key!r} {problem}.")


def _positive_int(key: str, value: object) -> int:
    # bool is an int in Python; `partitions = true` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid(key, f"must be a whole number of 1 or more, not {value!r}")
    return value


_Raw = TypeVar("_Raw")


def _wrapped(key: str, parse: Callable[[_Raw], float], raw: _Raw) -> float:
    try:
        return parse(raw)
    except ConfigError as exc:
        raise ConfigError(f"{key!r}: {exc}") from exc


def _duration(key: str, raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise _invalid(key, f"must be a duration such as '7d', not {raw!r}")
    return _wrapped(key, parse_duration, raw)


def _list_of(key: str, raw: object, kinds: tuple[type, ...]) -> list[object]:
    if not isinstance(raw, list) or any(
        isinstance(item, bool) or not isinstance(item, kinds) for item in raw
    ):
        example = '["5s", "1m", "10m"]' if key == "retry_tiers" else '["high", "default"]'
        raise _invalid(key, f"must be a list such as {example}, not {raw!r}")
    return list(raw)


def _field_paths(key: str, raw: object) -> tuple[str, ...]:
    """Field names, dotted paths into nested objects: `["card_number", "customer.ssn"]`."""
    if not isinstance(raw, list) or not all(
            isinstance(p, str) and p and all(p.split(".")) for p in raw):
        raise _invalid(key, 'must be a list of field names, dotted into nested objects, '
                            f'such as ["card_number", "customer.ssn"], not {raw!r}')
    return tuple(raw)


def _normal_tiers(tiers: tuple[object, ...]) -> tuple[str, ...]:
    if not tiers:
        raise _invalid("retry_tiers", "needs at least one tier, e.g. [\"5s\"]")
    names: list[str] = []
    delays: list[float] = []
    for tier in tiers:
        if isinstance(tier, bool) or not isinstance(tier, str | int | float):
            raise _invalid("retry_tiers", f"has {tier!r}, which is not a duration")
        delay = _wrapped("retry_tiers", parse_duration, tier)
        name = format_duration(delay)
        # The name becomes part of a topic name that must parse back to the same delay.
        if delay <= 0 or "." in name or parse_duration(name) != delay:
            raise _invalid(
                "retry_tiers",
                f"has {tier!r}: a tier is a whole number of ms, s, m, h or d above zero",
            )
        if delays and delay <= delays[-1]:
            raise _invalid(
                "retry_tiers",
                f"must be strictly increasing; {name} follows {names[-1]}",
            )
        names.append(name)
        delays.append(delay)
    return tuple(names)


def _normal_priorities(priorities: tuple[str, ...]) -> tuple[str, ...]:
    for lane in priorities:
        if lane not in LANES:
            raise _invalid("priorities", f"has {lane!r}; lanes are {', '.join(LANES)}")
    duplicated = sorted({lane for lane in priorities if priorities.count(lane) > 1})
    if duplicated:
        raise _invalid("priorities", f"names {duplicated[0]!r} twice")
    if DEFAULT_LANE not in priorities:
        # Jobs enqueued without a priority, and the relay's default route, land there.
        raise _invalid("priorities", f"must include {DEFAULT_LANE!r}")
    return tuple(lane for lane in LANES if lane in priorities)


def _normal_weights(weights: tuple[tuple[str, int], ...],
                    priorities: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    given: dict[str, int] = {}
    for lane, weight in weights:
        if lane not in LANES:
            raise _invalid("lane_weights", f"has {lane!r}; lanes are {', '.join(LANES)}")
        if lane not in priorities:
            raise _invalid("lane_weights", f"weighs {lane!r}, which 'priorities' does not "
                                           f"declare ({', '.join(priorities)})")
        _positive_int(f"lane_weights.{lane}", weight)
        given[lane] = weight
    return tuple((lane, given.get(lane, DEFAULT_LANE_WEIGHTS[lane])) for lane in priorities)


def _ms(seconds: float) -> str:
    return str(round(seconds * 1000))


def load_job_types(directory: Path) -> dict[str, JobTypePolicy]:
    """Every job type declared in `directory/*.toml`, by type name.

    Raises ConfigError naming the file (and key) for a bad file, a duplicate type or a
    name clash, and saying how to declare a type when the directory holds none.
    """
    how = (
        f"declare each job type in {directory}/<type>.toml (e.g. {directory}/email.send.toml "
        "with `partitions = 6`), or point STREAM_JOBS_TOPICS_DIR at the folder that has them"
    )
    if not directory.is_dir():
        raise ConfigError(f"The topics folder {directory} does not exist: {how}.")
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise ConfigError(f"No job types in {directory}: {how}.")
    types: dict[str, JobTypePolicy] = {}
    for path in files:
        policy = _load_file(path)
        if policy.job_type in types:
            raise ConfigError(
                f"{path}: job type {policy.job_type!r} is already declared in "
                f"{types[policy.job_type].origin}; keep one file per type."
            )
        types[policy.job_type] = policy
    _refuse_clashes(types)
    return types


def _load_file(path: Path) -> JobTypePolicy:
    try:
        with path.open("rb") as stream:
            table = tomllib.load(stream)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}.") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}.") from exc
    declared = table.pop("type", None)
    if declared is not None and not isinstance(declared, str):
        raise ConfigError(f"{path}: 'type' must be a string such as 'email.send'.")
    job_type = declared if declared is not None else path.stem
    try:
        validate_job_type(job_type)
    except ConfigError as exc:
        key = "'type'" if declared is not None else "the file name"
        raise ConfigError(f"{path}: {key}: {exc}") from exc
    return JobTypePolicy.from_toml(table, job_type=job_type, source=str(path))


def _refuse_clashes(types: Mapping[str, JobTypePolicy]) -> None:
    # Kafka refuses a topic whose name equals another's once '.' is read as '_' (their
    # metric names would collide), so find it here rather than halfway through an apply.
    # The prefix is shared by every topic, so any placeholder shows the same clashes.
    seen: dict[str, tuple[str, JobTypePolicy]] = {}
    for policy in types.values():
        for spec in policy.all_topics("p"):
            folded = spec.name.replace(".", "_")
            if folded in seen and seen[folded][0] != spec.name:
                other_name, other = seen[folded]
                raise ConfigError(
                    f"{policy.origin}: topic {spec.name[2:]!r} clashes with "
                    f"{other_name[2:]!r} of {other.origin}: Kafka treats '.' and '_' alike "
                    "in topic names. Rename one of the types."
                )
            seen[folded] = (spec.name, policy)


def get_job_type(types: Mapping[str, JobTypePolicy], name: str) -> JobTypePolicy:
    """The policy of `name`; UnknownJobType telling how to declare it otherwise."""
    try:
        return types[name]
    except KeyError:
        raise UnknownJobType(
            f"Unknown job type {name!r}: declare it in topics/{name}.toml and run "
            "`stream-jobs topics apply`."
        ) from None
