"""`stream-jobs offsets reset`: move a stopped consumer group's committed offsets.

Rewinds or forwards a group (`P.T.worker`, `P.T.relay`, `P.T.dlq`) while it has no
members: it commits from outside the group (manual assignment, no join), which Kafka
accepts only for an empty group. The plan is shown before anything changes, and the
committed offsets are read back afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import NamedTuple

from stream_jobs.errors import BrokerError, ConfigError, GroupInUse, StreamJobsError
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import Admin, open_admin
from stream_jobs.kafka.consumer import Consumer, commit_as_outsider, open_reader
from stream_jobs.kafka.scan import partitions_of
from stream_jobs.naming import parse_topic
from stream_jobs.settings import Settings


class OffsetChange(NamedTuple):
    """One partition of a reset: the committed offset before (None: none) and after."""

    tp: TopicPartition
    old: int | None
    new: int


async def reset_offsets(settings: Settings, group: str, *, topic: str | None = None,
                        to_offset: int | None = None, to_time_ms: int | None = None,
                        to_earliest: bool = False, to_latest: bool = False,
                        force: bool = False, dry_run: bool = False,
                        on_plan: Callable[[list[OffsetChange]], None] | None = None,
                        ) -> list[OffsetChange]:
    """Move `group`'s committed offsets on `topic` (default: the topics it has offsets
    for, plus the topics its name says it reads) to one target, and return the changes.

    Refuses with `GroupInUse` while the group has members, since a running worker keeps
    its own positions and would commit over the reset. `force` skips that check (e.g.
    when the credentials may not describe groups); Kafka itself still refuses offsets
    from outside a group that has members. `on_plan` sees the changes before anything is
    committed; a dry run stops there. The committed offsets are read back and checked.
    """
    chosen = [to_offset is not None, to_time_ms is not None, to_earliest, to_latest]
    if sum(chosen) != 1:
        raise ConfigError("Give exactly one target: --to-offset, --to-time, --to-earliest "
                          "or --to-latest.")
    if to_offset is not None and to_offset < 0:
        raise ConfigError(f"--to-offset {to_offset} is negative; offsets count from 0.")
    async with open_admin(settings) as admin:
        if not force:
            await _refuse_members(admin, group)
        committed = await admin.committed_offsets(group)
        topics = await _group_topics(admin, settings, group, topic, committed)
    async with open_reader(settings) as consumer:
        tps = [TopicPartition(t, p) for t in topics for p in await partitions_of(consumer, t)]
        targets = await _targets(consumer, tps, to_offset, to_time_ms, to_latest)
    changes = [OffsetChange(tp, committed.get(tp), targets[tp]) for tp in tps]
    if on_plan is not None:
        on_plan(changes)
    if dry_run or not changes:
        return changes
    await commit_as_outsider(settings, group, {c.tp: c.new for c in changes})
    await _check_committed(settings, group, changes)
    return changes


async def _refuse_members(admin: Admin, group: str) -> None:
    try:
        members = await admin.group_hosts(group)
    except BrokerError as exc:
        raise BrokerError(f"{exc} --force skips this check.") from exc
    if members:
        hosts = sorted(set(members))
        count = f"{len(members)} active member{'s' if len(members) != 1 else ''}"
        raise GroupInUse(
            f"Consumer group {group!r} has {count} (on {', '.join(hosts)}): stop its "
            "workers first; a worker killed without draining leaves the group once its "
            "session times out (10 s).")


async def _group_topics(admin: Admin, settings: Settings, group: str, topic: str | None,
                        committed: Mapping[TopicPartition, int | None]) -> list[str]:
    existing = await admin.topic_names()
    if topic is not None:
        if topic not in existing:
            raise ConfigError(f"Topic {topic!r} does not exist: check the name with "
                              "`stream-jobs topics list`.")
        return [topic]
    topics = {tp.topic for tp in committed if tp.topic in existing}
    topics.update(_topics_named_by(settings.topic_prefix, group, existing))
    if not topics:
        raise ConfigError(
            f"Consumer group {group!r} has no committed offsets and reads none of our "
            f"topics: check the name ({settings.topic_prefix}.TYPE.worker, .relay or .dlq), "
            "or give --topic.")
    return sorted(topics)


def _topics_named_by(prefix: str, group: str, existing: set[str]) -> set[str]:
    """The topics a group of ours reads: T.worker the lanes and the overflow lane,
    T.shadow the lanes, T.relay the tiers, T.dlq the DLQ."""
    roles = {"worker": ("lane", "overflow"), "shadow": ("lane",), "relay": ("tier",),
             "dlq": ("dlq",)}
    body, _, role_name = group.rpartition(".")
    role = roles.get(role_name)
    if role is None or not body.startswith(f"{prefix}."):
        return set()
    job_type = body[len(prefix) + 1:]
    found = set()
    for name in existing:
        with contextlib.suppress(ConfigError):
            ref = parse_topic(prefix, name)
            if ref.job_type == job_type and ref.role in role:
                found.add(name)
    return found


async def _targets(consumer: Consumer, tps: list[TopicPartition], to_offset: int | None,
                   to_time_ms: int | None, to_latest: bool) -> dict[TopicPartition, int]:
    firsts = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    if to_latest:
        return dict(ends)
    if to_time_ms is not None:
        found = await consumer.offsets_for_times(dict.fromkeys(tps, to_time_ms))
        return {tp: at if (at := found.get(tp)) is not None else ends[tp] for tp in tps}
    if to_offset is None:  # to earliest
        return dict(firsts)
    for tp in tps:
        if not firsts[tp] <= to_offset <= ends[tp]:
            raise ConfigError(f"Offset {to_offset} is out of range for {tp.topic} partition "
                              f"{tp.partition}, which can be set to {firsts[tp]} to {ends[tp]}.")
    return dict.fromkeys(tps, to_offset)


async def _check_committed(settings: Settings, group: str, changes: list[OffsetChange]) -> None:
    async with open_admin(settings) as admin:
        now = await admin.committed_offsets(group, [c.tp for c in changes])
    wrong = [c for c in changes if now.get(c.tp) != c.new]
    if wrong:
        first = wrong[0]
        raise StreamJobsError(
            f"Group {group!r} reads back a different offset for {first.tp.topic} partition "
            f"{first.tp.partition} than the {first.new} just committed: did a worker start? "
            "Check with --dry-run and run the reset again.")


__all__ = ["GroupInUse", "OffsetChange", "reset_offsets"]
