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

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stream_jobs.durations import format_duration, parse_duration
from stream_jobs.errors import ConfigError, UnknownJobType
from stream_jobs.naming import (
    DEFAULT_LANE,
    MAX_TOPIC_LENGTH,
    TopicRole,
    lane_topic,
    overflow_topic,
    tier_topic,
    validate_job_type,
)
from stream_jobs.naming import dlq_topic as _dlq_topic
from stream_jobs.periodic import ScheduleSpec
from stream_jobs.settings import Settings
from stream_jobs.tenants import FairnessSpec
from stream_jobs.type_keys import (
    KNOWN_KEYS,
    invalid,
    normal_priorities,
    normal_tiers,
    normal_weights,
    positive_int,
    read_key,
    unknown_key,
)

# Every topic gets room for a 1 MiB payload plus key and headers, whatever the broker's default.
MAX_MESSAGE_BYTES = 2_097_152
# Kept free inside a record for the key and the headers (IDs, times, origin, last error).
RECORD_OVERHEAD_BYTES = 65_536
# Dead letters are read later, by a person, often after the incident: keep them longer.
DLQ_RETENTION_FACTOR = 4
# With 3 replicas, acks=all then survives one broker down without refusing writes.
MIN_INSYNC_FROM_REPLICAS = 3

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
        positive_int("partitions", self.partitions)
        positive_int("replication_factor", self.replication_factor)
        positive_int("max_attempts", self.max_attempts)
        if self.max_payload_bytes is not None:
            positive_int("max_payload_bytes", self.max_payload_bytes)
            limit = MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES
            if self.max_payload_bytes > limit:
                raise invalid(
                    "max_payload_bytes",
                    f"must be at most {limit} (a record is capped at {MAX_MESSAGE_BYTES} "
                    "bytes and the key and headers need room too)",
                )
        if not self.retention_s > 0:
            raise invalid("retention", "must be longer than zero")
        if self.expires_in_s is not None and not self.expires_in_s > 0:
            raise invalid("expires_in", "must be longer than zero")
        if self.rate_limit_per_s is not None and not self.rate_limit_per_s > 0:
            raise invalid("rate_limit", "must be a positive rate")
        if (self.heartbeat_interval_s is not None
                and not self.heartbeat_interval_s >= MIN_HEARTBEAT_INTERVAL_S):
            raise invalid("heartbeat_interval",
                           f"must be at least {format_duration(MIN_HEARTBEAT_INTERVAL_S)}")
        # Normalising here means `JobTypePolicy(...)` in code and a TOML file agree.
        object.__setattr__(self, "retry_tiers", normal_tiers(self.retry_tiers))
        object.__setattr__(self, "priorities", normal_priorities(self.priorities))
        object.__setattr__(self, "lane_weights",
                           normal_weights(self.lane_weights, self.priorities))
        longest = self.tier_delays_s[-1]
        if self.retention_s <= longest:
            # A record waiting in the longest tier would be deleted before it is due.
            raise invalid(
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
                raise ConfigError(f"{where}{unknown_key(key)}")
        values: dict[str, object] = {}
        try:
            for key, raw in table.items():
                if key != "type":  # the loader's business: it names the type
                    values.update(read_key(key, raw))
            return cls(job_type=job_type, source=source, **values)  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(f"{where}{exc}") from exc


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
    except RecursionError:  # tomllib reads nested arrays and inline tables recursively
        raise ConfigError(f"{path}: its arrays or inline tables are nested too deeply to "
                          "read; flatten them.") from None
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
