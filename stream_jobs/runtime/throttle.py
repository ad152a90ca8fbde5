"""Run-time rate limits through a compacted control topic, `P._control`.

`stream-jobs throttle TYPE 50/s` (and `drain TYPE --rate`) writes one record keyed by the
type; Kafka's compaction keeps the latest per type, so the topic stays as small as the
number of types. Every worker follows the topic from its beginning: it reads it to the
end before starting jobs, then applies each new record as it arrives (a long poll, so
within a fraction of a second). `throttle TYPE --reset` writes a tombstone, which puts
the type back on the `rate_limit` of its TOML.

The value is JSON, readable by any Kafka tool: `{"rate_limit_per_s": 50.0, "at_ms": ...,
"by": "throttle"}`; a `rate_limit_per_s` of null lifts the limit altogether.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from stream_jobs.errors import BrokerUnavailable
from stream_jobs.kafka import TopicPartition, scan
from stream_jobs.kafka.admin import ensure_internal_topic
from stream_jobs.kafka.consumer import Consumer, new_consumer
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.naming import control_topic
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.control")

SOURCES = ("throttle", "drain")


@dataclass(frozen=True)
class RateOverride:
    """An operator's rate for one type, in force until the next one (or a reset)."""

    rate_limit_per_s: float | None  # None: no limit at all, whatever the TOML says
    at_ms: int
    by: str = "throttle"  # the command that set it

    def to_json(self) -> bytes:
        return orjson.dumps({"rate_limit_per_s": self.rate_limit_per_s, "at_ms": self.at_ms,
                             "by": self.by})

    @classmethod
    def from_json(cls, raw: bytes) -> RateOverride | None:
        """The override in `raw`, or None for anything that is not one (never raises)."""
        try:
            data: Any = orjson.loads(raw)
            rate = data["rate_limit_per_s"]
            if rate is not None:
                rate = float(rate)
                if not rate > 0:
                    return None
            return cls(rate, int(data.get("at_ms", 0)), str(data.get("by", "throttle")))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class RateInForce:
    """The limit a type runs under and where it comes from: "throttle" or "drain" (an
    operator's override), "toml" (its `rate_limit`), or "none"."""

    per_s: float | None
    source: str


NO_LIMIT = RateInForce(None, "none")


def rate_in_force(toml_rate_per_s: float | None,
                  override: RateOverride | None) -> RateInForce:
    """An override wins over the TOML until it is reset."""
    if override is not None:
        return RateInForce(override.rate_limit_per_s, override.by)
    if toml_rate_per_s is not None:
        return RateInForce(toml_rate_per_s, "toml")
    return NO_LIMIT


def apply_record(overrides: dict[str, RateOverride], key: bytes | None,
                 value: bytes | None) -> str | None:
    """Fold one control record into `overrides` (type -> override); the type it changed.

    A tombstone removes the type's override; a record that is not ours changes nothing.
    """
    if not key:
        return None
    try:
        job_type = key.decode()
    except UnicodeDecodeError:
        return None
    if value is None:
        overrides.pop(job_type, None)
        return job_type
    override = RateOverride.from_json(value)
    if override is None:
        log.warning("ignoring a control record for %r that is not a rate: %r", job_type,
                    value[:200])
        return None
    overrides[job_type] = override
    return job_type


# ---------------------------------------------------------------------------------------
# Kafka.


async def ensure_control_topic(settings: Settings) -> None:
    """Create `P._control` if it is missing: one partition, compacted, kept forever."""
    await ensure_internal_topic(settings, control_topic(settings.topic_prefix),
                                {"cleanup.policy": "compact", "retention.ms": "-1"})


async def publish_rate(settings: Settings, job_type: str, rate_limit_per_s: float | None, *,
                       at_ms: int, by: str = "throttle", reset: bool = False) -> None:
    """Set `job_type`'s rate for every worker (None: no limit); `reset` returns it to the
    TOML. Returns once the broker has the record (acks=all)."""
    await ensure_control_topic(settings)
    value = None if reset else RateOverride(rate_limit_per_s, at_ms, by).to_json()
    async with JobProducer(settings) as producer:
        await producer.send_raw(control_topic(settings.topic_prefix), job_type.encode(),
                                value, [])


async def read_overrides(consumer: Consumer, prefix: str) -> dict[str, RateOverride]:
    """Every type's override, read with a group-less `consumer` (none if the topic is
    missing). Ask offset questions of other topics first: reading assigns this topic."""
    topic = control_topic(prefix)
    if not await consumer.cluster_partitions(topic):
        return {}
    overrides: dict[str, RateOverride] = {}
    async for record in scan.scan(consumer, topic, await scan.ranges(consumer, topic)):
        apply_record(overrides, record.key, record.value)
    return overrides


class ControlFollower:
    """Follows `P._control` for a worker: `catch_up` reads it to the end, `follow` applies
    each later record. `on_change(job_type, override)` is called for every type that changed.
    """

    def __init__(self, settings: Settings,
                 on_change: Callable[[str, RateOverride | None], None]) -> None:
        self.settings = settings
        self.on_change = on_change
        self.overrides: dict[str, RateOverride] = {}
        self._caught_up = False  # history is folded in silently; callers read `overrides`
        self._tp = TopicPartition(control_topic(settings.topic_prefix), 0)
        self._consumer = new_consumer(
            settings, client_id="stream-jobs-control", group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", fetch_max_wait_ms=500)

    async def catch_up(self, timeout_s: float = 30.0) -> None:
        """Make sure the topic exists, then apply everything it holds now."""
        consumer = self._consumer
        await consumer.start()
        try:
            async with asyncio.timeout(timeout_s):
                if not await consumer.cluster_partitions(self._tp.topic):
                    await ensure_control_topic(self.settings)
                    # Until this client's metadata has it, aiokafka would log it missing.
                    while not consumer.partitions_for_topic(self._tp.topic):
                        await consumer.refresh_metadata()
                        await asyncio.sleep(0.05)  # a back-off between metadata rounds
                # Asked before `assign`: afterwards aiokafka answers after a metadata round.
                end = (await self._consumer.end_offsets([self._tp]))[self._tp]
                self._consumer.assign([self._tp])
                await self._consumer.seek_to_beginning(self._tp)
                while await self._consumer.position(self._tp) < end:
                    await self._poll(500)
            self._caught_up = True
        except TimeoutError as exc:
            raise BrokerUnavailable(f"{self._tp.topic} could not be read to its end within "
                                    f"{timeout_s:.0f} s; is the broker healthy?") from exc

    async def follow(self) -> None:
        """Apply new records until cancelled; errors are logged and the read retried."""
        while True:
            try:
                await self._poll(1000)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Best effort, like reports: jobs never wait on it, and it must not die.
                log.warning("reading %s failed, trying again: %s", self._tp.topic, exc)
                await asyncio.sleep(1.0)  # a back-off, not a wait for a condition

    async def stop(self) -> None:
        await self._consumer.stop()

    async def _poll(self, timeout_ms: int) -> None:
        batches = await self._consumer.getmany(self._tp, timeout_ms=timeout_ms)
        for record in batches.get(self._tp, []):
            changed = apply_record(self.overrides, record.key, record.value)
            if changed is not None and self._caught_up:
                self.on_change(changed, self.overrides.get(changed))


__all__ = [
    "NO_LIMIT",
    "ControlFollower",
    "RateInForce",
    "RateOverride",
    "apply_record",
    "ensure_control_topic",
    "publish_rate",
    "rate_in_force",
    "read_overrides",
]
