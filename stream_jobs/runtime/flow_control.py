"""Flow control of one job type's worker: its share of the rate limit, and heartbeats.

The type's rate limit (TOML, or `stream-jobs throttle` through `P._control`) is split
across the group by partition ownership (`stream_jobs.ratelimit.partition_share`): each
worker takes its fraction of the lane partitions, again at every assignment. Heartbeats
are written into every lane partition and acknowledged at fetch time
(`stream_jobs.runtime.heartbeats`). docs/flow-control.md is the user's side.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import replace

from stream_jobs.clock import now_ms
from stream_jobs.errors import StreamJobsError
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.naming import control_topic
from stream_jobs.ratelimit import partition_share
from stream_jobs.record import HEADER_EXPIRES_AT
from stream_jobs.runtime.heartbeats import send_heartbeats
from stream_jobs.runtime.member import Flow, GroupMember
from stream_jobs.runtime.throttle import ControlFollower, RateOverride, rate_in_force

log = logging.getLogger("stream_jobs.worker")

# Under a rate limit a worker buffers about this many seconds of its share (at least
# RATE_BUFFER_MIN records per partition): fetching pauses instead of holding a backlog.
RATE_BUFFER_S = 2.0
RATE_BUFFER_MIN = 16


def header_expires_at_ms(headers: Sequence[tuple[str, bytes]]) -> int | None:
    """The `sj-expires-at` header as decode_record reads it (the last one wins); None if
    absent or malformed (decode_record then has the final word)."""
    found: int | None = None
    for name, value in headers:
        if name == HEADER_EXPIRES_AT:
            found = int(value) if value.isdigit() and len(value) <= 19 else None
    return found


class FlowControlled(GroupMember):
    """A group member that follows its type's rate limit and writes heartbeats.

    `stream_jobs.runtime.worker.Worker` is one; it calls `init_flow` once its policy is set.
    """

    policy: JobTypePolicy
    worker_id: str

    def init_flow(self, policy: JobTypePolicy, *, control: bool) -> None:
        self.control = control  # whether `stream-jobs throttle` reaches this worker
        self.rate = rate_in_force(policy.rate_limit_per_s, None)
        self.rate_share_per_s: float | None = None
        self.heartbeat_interval_s = policy.heartbeat_interval_s
        # Per lane partition: the write time (ms) of the newest heartbeat processed.
        self.heartbeats: dict[TopicPartition, int] = {}

    async def _catch_up(self, follower: ControlFollower | None) -> None:
        if follower is None:
            return
        try:
            await follower.catch_up()
        except StreamJobsError as exc:
            # The TOML's limit still holds; only run-time changes are lost.
            log.warning("cannot read %s; `stream-jobs throttle` will not reach this worker: "
                        "%s", control_topic(self.settings.topic_prefix), exc)
            return
        self._apply_rate(follower.overrides.get(self.policy.job_type))
        # The group may have assigned partitions meanwhile (aiokafka joins in the
        # background); nothing was dispatched yet, so the share is right from the start.
        self._reshare()

    def _on_control(self, job_type: str, override: RateOverride | None) -> None:
        if job_type == self.policy.job_type:
            self._apply_rate(override)
            self._reshare()

    def _apply_rate(self, override: RateOverride | None) -> None:
        rate = rate_in_force(self.policy.rate_limit_per_s, override)
        if rate != self.rate:
            limit = "no limit" if rate.per_s is None else f"{rate.per_s:g}/s"
            log.info("%s: rate limit now %s (%s)", self.policy.job_type, limit, rate.source)
        self.rate = rate

    def adopt(self, tps: list[TopicPartition]) -> None:
        super().adopt(tps)
        self._reshare()

    async def release(self, tps: list[TopicPartition]) -> None:
        await super().release(tps)
        for tp in tps:
            self.heartbeats.pop(tp, None)
        self._reshare()

    def _reshare(self) -> None:
        """Take this worker's share of the type's rate: its fraction of the lane partitions."""
        limit = self.rate.per_s
        screen = limit is not None or self.heartbeat_interval_s is not None
        base = self.base_flow
        if limit is None:
            self.rate_share_per_s = None
            self.set_flow(replace(base, screen=screen))
            return
        assigned = sum(1 for w in self.partitions.values() if not w.revoked)
        total = sum(len(self.consumer.partitions_for_topic(t) or ()) for t in self.topics)
        share = partition_share(limit, assigned, total)
        self.rate_share_per_s = share
        per_partition = math.ceil(share * RATE_BUFFER_S / max(1, assigned))
        self.set_flow(Flow(
            max_buffered=min(base.max_buffered, max(RATE_BUFFER_MIN, per_partition)),
            # Backpressure is checked after each fetched batch: keep batches small too.
            fetch_records=min(base.fetch_records,
                              max(RATE_BUFFER_MIN, math.ceil(share * RATE_BUFFER_S))),
            rate_per_s=share, screen=screen))


    def _beat(self, tp: TopicPartition, written_ms: int) -> None:
        if written_ms > self.heartbeats.get(tp, -1):
            self.heartbeats[tp] = written_ms

    async def _heartbeat_every(self) -> None:
        interval_s = self.heartbeat_interval_s
        assert interval_s is not None
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            tps = [TopicPartition(topic, p) for topic in self.topics
                   for p in sorted(self.consumer.partitions_for_topic(topic) or ())]
            try:
                await send_heartbeats(self.producer, tps, self.worker_id, now_ms())
            except StreamJobsError as exc:
                log.warning("heartbeats not written: %s", exc)
            # On a fixed schedule: the time a send takes does not stretch the interval.
            due = max(due + interval_s, loop.time())
            await asyncio.sleep(due - loop.time())  # a period, not a wait for a condition
