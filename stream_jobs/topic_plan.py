"""What it takes to make Kafka match a job type's policy: the plan of `topics apply`. Pure.

`diff_policy` compares the topics a type declares (`JobTypePolicy.all_topics`) with what
the broker reports (`TopicState`) and returns the `Change`s; `stream_jobs.kafka.topics`
asks the broker and sends them. Nothing here (or there) ever deletes a topic or a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from stream_jobs.errors import TopicPlanError
from stream_jobs.job_types import JobTypePolicy, TopicSpec
from stream_jobs.plurals import counted

ChangeAction = Literal["create", "add-partitions", "set-config", "ok", "warn"]


@dataclass(frozen=True)
class Change:
    """One step `topics apply` takes (or, for "ok" and "warn", does not take) on a topic.

    "warn" reports a difference apply never acts on: a replication factor, since changing
    it means moving replicas between brokers, which is an operator's decision.
    """

    action: ChangeAction
    topic: str
    detail: str


@dataclass(frozen=True)
class TopicState:
    """A topic as the broker reports it. `overrides` are its topic-level configs only."""

    name: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str]
    overrides: Mapping[str, str] = field(default_factory=dict)


def diff_policy(policy: JobTypePolicy, prefix: str,
                states: Mapping[str, TopicState]) -> list[Change]:
    """What it takes to make Kafka match `policy`; `states` holds the topics that exist.

    Raises TopicPlanError when a topic has more partitions than declared: Kafka cannot
    remove partitions, and deleting the topic would lose its records.
    """
    changes: list[Change] = []
    for spec in policy.all_topics(prefix):
        state = states.get(spec.name)
        changes.extend(diff_topic(spec, state, origin=policy.origin))
    return changes


def diff_topic(spec: TopicSpec, state: TopicState | None, *, origin: str = "the policy"
               ) -> list[Change]:
    """The changes for one topic (see `diff_policy`); ["ok"] when it already matches."""
    if state is None:
        configs = ", ".join(f"{k}={v}" for k, v in spec.configs.items())
        return [Change("create", spec.name, f"{counted(spec.partitions, 'partition')}, "
                                             f"replication factor {spec.replication_factor}, "
                                             f"{configs}")]
    changes: list[Change] = []
    if state.partitions > spec.partitions:
        raise TopicPlanError(
            f"{spec.name} has {counted(state.partitions, 'partition')}; {origin} asks for "
            f"{spec.partitions}: Kafka cannot shrink a topic without deleting its records "
            f"(create a new type or keep {state.partitions})."
        )
    if state.partitions < spec.partitions:
        changes.append(Change(
            "add-partitions", spec.name,
            f"{state.partitions} -> {spec.partitions} partitions (keys move to other "
            "partitions: per-key order holds only among records produced after)",
        ))
    if state.replication_factor != spec.replication_factor:
        changes.append(Change(
            "warn", spec.name,
            f"replication factor is {state.replication_factor}; {origin} asks for "
            f"{spec.replication_factor}: not applied, stream-jobs never moves replicas "
            "(use kafka-reassign-partitions.sh)",
        ))
    differing = {k: v for k, v in spec.configs.items() if state.configs.get(k) != v}
    if differing:
        changes.append(Change("set-config", spec.name, ", ".join(
            f"{k} {state.configs.get(k, 'unset')} -> {v}" for k, v in differing.items()
        )))
    if not [c for c in changes if c.action != "warn"]:
        changes.insert(0, Change("ok", spec.name, counted(state.partitions, "partition")))
    return changes


def desired_overrides(spec: TopicSpec, state: TopicState) -> dict[str, str]:
    """The full set of topic-level configs to send for `spec`.

    Kafka's AlterConfigs replaces a topic's whole override set, so overrides someone set
    by hand on keys we do not manage are carried over rather than reset.
    """
    return {**state.overrides, **spec.configs}
