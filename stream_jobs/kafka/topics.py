"""Making Kafka match topics/: plan, apply and list a deployment's topics. Thin I/O.

What to change is decided by the pure `stream_jobs.topic_plan.diff_policy`; this module
only asks the broker what exists and sends the changes. Nothing here deletes a topic or a
record: removing a type's file leaves its topics (and `topics list` shows them as
undeclared). A replication factor that differs is reported as a "warn" change and never
applied, since changing it means moving replicas between brokers, an operator's decision.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    KafkaError,
    for_code,
)

from stream_jobs.errors import BrokerUnavailable, ConfigError, TopicPlanError
from stream_jobs.job_types import JobTypePolicy, TopicSpec
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import UNREACHABLE, admin_client
from stream_jobs.kafka.consumer import open_consumer
from stream_jobs.naming import TopicRef, TopicRole, parse_topic
from stream_jobs.settings import Settings
from stream_jobs.topic_plan import Change, TopicState, desired_overrides, diff_policy

_TOPIC_ALREADY_EXISTS = 36
# DescribeConfigs' config_source for a value set on the topic itself.
_DYNAMIC_TOPIC_CONFIG = 1


@dataclass(frozen=True)
class TopicRow:
    """One line of `stream-jobs topics list`.

    `partitions` is the broker's count when the topic exists, else the declared one.
    `messages` is what the topic still holds (end minus start offsets, summed over its
    partitions); `end_offset_sum` counts every record ever written. Both are None when
    the topic does not exist.
    """

    topic: str
    job_type: str
    role: TopicRole
    name: str  # the lane ("high"), the tier ("5s") or "dlq"
    partitions: int
    exists: bool
    declared: bool
    messages: int | None
    end_offset_sum: int | None


async def plan(settings: Settings, types: Mapping[str, JobTypePolicy]) -> list[Change]:
    """What `apply` would change, changing nothing. Raises TopicPlanError for a change
    Kafka cannot make (fewer partitions, more replicas than brokers)."""
    async with admin_client(settings) as admin:
        changes, _, _ = await _plan(admin, settings.topic_prefix, types)
    return changes


async def apply(settings: Settings, types: Mapping[str, JobTypePolicy]) -> list[Change]:
    """Create missing topics, add partitions, set configs; return what was planned.

    Idempotent: a second run returns only "ok" (and "warn") changes. Validates the whole
    plan before changing anything. Returns once every partition created has a leader, so
    a producer can use the topics at once.
    """
    async with admin_client(settings) as admin:
        changes, specs, states = await _plan(admin, settings.topic_prefix, types)
        todo = {(c.action, c.topic) for c in changes}
        created = [s for s in specs if ("create", s.name) in todo]
        grown = [s for s in specs if ("add-partitions", s.name) in todo]
        configured = [s for s in specs if ("set-config", s.name) in todo]
        deadline = time.monotonic() + settings.kafka_request_timeout_ms / 1000
        if created:
            await _create(admin, created, settings.kafka_request_timeout_ms)
        if grown:
            await _grow(admin, grown, settings.kafka_request_timeout_ms)
        if configured:
            await _configure(admin, configured, states)
        await _until_settled(admin, [*created, *grown], configured, deadline)
    return changes


async def list_topics(settings: Settings, types: Mapping[str, JobTypePolicy]
                      ) -> list[TopicRow]:
    """Every declared topic, existing or not, then topics under our prefix that no file
    declares (a removed type's topics are kept, never deleted)."""
    prefix = settings.topic_prefix
    specs = _specs(prefix, types)
    async with admin_client(settings) as admin:
        names = set(await admin.list_topics())
        declared = {s.name for s in specs}
        orphans = sorted(n for n in names if n.startswith(f"{prefix}.") and n not in declared)
        states = await _describe(admin, [*(s.name for s in specs if s.name in names), *orphans])
    counts = await _offsets(settings, states)
    rows = [_row(s.name, s.job_type, s.role, _short(prefix, s), s.partitions,
                 states.get(s.name), counts, declared=True) for s in specs]
    for name in orphans:
        try:
            ref = parse_topic(prefix, name)
        except ConfigError:
            continue  # under our prefix by name only: not a topic stream-jobs makes
        short = _short_of(ref)
        state = states[name]
        rows.append(_row(name, ref.job_type, ref.role, short, state.partitions, state, counts,
                         declared=False))
    return rows


def _row(topic: str, job_type: str, role: TopicRole, short: str, partitions: int,
         state: TopicState | None, counts: Mapping[str, tuple[int, int]], *, declared: bool
         ) -> TopicRow:
    if state is None:
        return TopicRow(topic, job_type, role, short, partitions, False, declared, None, None)
    held, written = counts.get(topic, (0, 0))
    return TopicRow(topic, job_type, role, short, state.partitions, True, declared, held,
                    written)


def _short(prefix: str, spec: TopicSpec) -> str:
    return _short_of(parse_topic(prefix, spec.name))


def _short_of(ref: TopicRef) -> str:
    """A topic's name within its type: the lane, the tier, "dlq" or "overflow"."""
    if ref.role == "lane":
        return ref.lane
    return ref.tier or ref.role


def _specs(prefix: str, types: Mapping[str, JobTypePolicy]) -> list[TopicSpec]:
    return [spec for name in sorted(types) for spec in types[name].all_topics(prefix)]


async def _plan(admin: Any, prefix: str, types: Mapping[str, JobTypePolicy]
                ) -> tuple[list[Change], list[TopicSpec], dict[str, TopicState]]:
    specs = _specs(prefix, types)
    # Only topics that exist are described: a metadata request naming a missing topic
    # creates it on brokers with auto.create.topics.enable=true, and plan must not.
    existing = set(await admin.list_topics())
    states = await _describe(admin, [s.name for s in specs if s.name in existing])
    changes = [c for name in sorted(types) for c in diff_policy(types[name], prefix, states)]
    creating = {c.topic for c in changes if c.action == "create"}
    if creating:
        brokers = len((await admin.describe_cluster())["brokers"])
        for name in sorted(types):
            policy = types[name]
            if policy.replication_factor > brokers and any(
                s.name in creating for s in policy.all_topics(prefix)
            ):
                raise TopicPlanError(
                    f"{policy.origin} asks for replication_factor {policy.replication_factor} "
                    f"but the cluster has {brokers} broker{'s' if brokers != 1 else ''}: "
                    "lower it, or add brokers first."
                )
    return changes, specs, states


async def _describe(admin: Any, names: list[str]) -> dict[str, TopicState]:
    if not names:
        return {}
    described = await admin.describe_topics(names)
    layout: dict[str, tuple[int, int]] = {}
    for topic in described:
        partitions = topic["partitions"]
        replicas = max((len(p["replicas"]) for p in partitions), default=0)
        layout[topic["topic"]] = (len(partitions), replicas)
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    )
    states: dict[str, TopicState] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            name = str(resource["resource_name"])
            _raise_for(resource["error_code"], resource.get("error_message"),
                       f"Kafka did not describe the configs of {name}")
            configs: dict[str, str] = {}
            overrides: dict[str, str] = {}
            for entry in resource["config_entries"]:
                key, value = str(entry["config_names"]), entry["config_value"]
                if value is None:  # sensitive values are not returned; never ours
                    continue
                configs[key] = str(value)
                if _is_override(entry):
                    overrides[key] = str(value)
            partitions, replicas = layout.get(name, (0, 0))
            states[name] = TopicState(name, partitions, replicas, configs, overrides)
    return states


def _is_override(entry: Mapping[str, Any]) -> bool:
    if "config_source" in entry:
        return bool(entry["config_source"] == _DYNAMIC_TOPIC_CONFIG)
    return not entry.get("is_default", True)  # DescribeConfigs v0 has no config_source


async def _create(admin: Any, specs: list[TopicSpec], timeout_ms: int) -> None:
    response = await admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=s.configs)
         for s in specs],
        timeout_ms=timeout_ms,
    )
    for topic, code, message in _topic_errors(response):
        # Another `apply` created it meanwhile; the next plan compares it like any other.
        if code != _TOPIC_ALREADY_EXISTS:
            _raise_for(code, message, f"Kafka refused to create {topic}")


def _topic_errors(response: Any) -> list[tuple[str, int, str | None]]:
    return [(str(e["topic"]), int(e["error_code"]), e.get("error_message"))
            for e in response.to_object()["topic_errors"]]


async def _grow(admin: Any, specs: list[TopicSpec], timeout_ms: int) -> None:
    try:
        await admin.create_partitions({s.name: NewPartitions(s.partitions) for s in specs},
                                      timeout_ms=timeout_ms)
    except UNREACHABLE:
        raise
    except KafkaError as exc:
        raise TopicPlanError(f"Kafka refused to add partitions: {exc}.") from exc


async def _configure(admin: Any, specs: list[TopicSpec], states: Mapping[str, TopicState]
                     ) -> None:
    # AlterConfigs replaces a topic's whole override set (aiokafka has no incremental
    # variant), so `desired_overrides` carries over keys set by hand as read in `_describe`;
    # a hand change made between that read and this write is lost.
    responses = await admin.alter_configs([
        ConfigResource(ConfigResourceType.TOPIC, s.name, desired_overrides(s, states[s.name]))
        for s in specs
    ])
    for response in responses:
        for resource in response.to_object()["resources"]:
            _raise_for(resource["error_code"], resource.get("error_message"),
                       f"Kafka refused the configs of {resource['resource_name']}")


def _raise_for(code: int, message: str | None, what: str) -> None:
    if code:
        error = for_code(code)
        detail = message or getattr(error, "description", "") or error.__name__
        raise TopicPlanError(f"{what}: {error.__name__}: {detail}")


async def _until_settled(admin: Any, grown: list[TopicSpec], configured: list[TopicSpec],
                         deadline: float) -> None:
    """Return once the broker reports what apply asked for: every new partition has a
    leader and every config set reads back. Kafka answers a change once the controller
    has it; the broker serving metadata can lag by a few milliseconds, and a producer or
    a plan started right after apply must see the result."""
    pause = 0.02
    while True:
        lagging = await _unsettled(admin, grown, configured)
        if not lagging:
            return
        if time.monotonic() >= deadline:
            raise BrokerUnavailable(
                f"Kafka accepted the changes to {', '.join(lagging)} but does not report them "
                "done in time: a broker may be down. Run `stream-jobs topics apply` again "
                "once the cluster is healthy."
            )
        # Polling with a deadline: on a healthy cluster this settles in milliseconds.
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)


async def _unsettled(admin: Any, grown: list[TopicSpec], configured: list[TopicSpec]
                     ) -> list[str]:
    lagging: list[str] = []
    if grown:
        led = await _leadership(admin, {s.name: s.partitions for s in grown})
        lagging.extend(name for name, ready in led.items() if not ready)
    if configured:
        states = await _describe(admin, [s.name for s in configured])
        lagging.extend(
            s.name for s in configured
            if any(states[s.name].configs.get(k) != v for k, v in s.configs.items())
        )
    return lagging


async def _leadership(admin: Any, wanted: Mapping[str, int]) -> dict[str, bool]:
    described = await admin.describe_topics(list(wanted))
    ready = dict.fromkeys(wanted, False)
    for topic in described:
        partitions = topic["partitions"]
        ready[topic["topic"]] = (
            topic["error_code"] == 0
            and len(partitions) >= wanted[topic["topic"]]
            and all(p["error_code"] == 0 and p["leader"] >= 0 for p in partitions)
        )
    return ready


async def _offsets(settings: Settings, states: Mapping[str, TopicState]
                   ) -> dict[str, tuple[int, int]]:
    """Topic -> (records held, end offset sum). A partition's ids run 0..n-1 in Kafka."""
    partitions = [TopicPartition(name, i) for name, s in states.items()
                  for i in range(s.partitions)]
    if not partitions:
        return {}
    async with open_consumer(settings, client_id="stream-jobs-admin",
                             enable_auto_commit=False) as consumer:
        starts = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
    counts: dict[str, tuple[int, int]] = {}
    for tp in partitions:
        held, written = counts.get(tp.topic, (0, 0))
        counts[tp.topic] = (held + ends[tp] - starts[tp], written + ends[tp])
    return counts


__all__ = ["Change", "TopicRow", "apply", "list_topics", "plan"]
