"""A write the broker refuses for good must not stall the partition's later writes.

aiokafka's idempotent producer keeps the sequence numbers of a refused batch, so every
later write to that partition fails with OutOfOrderSequenceNumber; the producer must
renew itself (a new producer ID) so that a retried write goes through."""

from __future__ import annotations

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from stream_jobs.errors import PublishError
from stream_jobs.job_ids import new_job_id
from stream_jobs.kafka.admin import admin_client, until_led
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from tests.waiting import until


async def _set_max_message_bytes(settings: Settings, topic: str, value: str | None) -> None:
    configs = {} if value is None else {"max.message.bytes": value}
    async with admin_client(settings) as admin:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])


def _job() -> JobRecord:
    return JobRecord(job_id=new_job_id(), job_type="renew.x", payload=b'{"n": 1}', key=None)


async def test_writes_go_through_again_after_the_broker_refused_one(
        settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.renew"
    async with admin_client(settings) as admin:
        await admin.create_topics([NewTopic(topic, 1, 1)])
        # Created is not yet led: a write right away met "does not exist" in a loaded run.
        await until_led(admin, topic, 30)
    async with JobProducer(settings) as producer:
        await producer.send(topic, _job())  # the partition has a sequence already
        await _set_max_message_bytes(settings, topic, "16")

        async def refused() -> bool:
            # The broker applies a config change when it reads it from the metadata log,
            # a moment after the admin call returns: until then a write may still pass.
            try:
                await producer.send(topic, _job())
            except PublishError:
                return True
            return False

        await until(refused, "the broker refuses records over 16 bytes")
        assert await refused()
        assert await refused()
        await _set_max_message_bytes(settings, topic, None)
        outcomes: list[str] = []

        async def accepted() -> bool:
            # Until the broker applies the reset, writes are still too large; after it, the
            # first may meet the stale sequence (and renew the producer). Without renewal
            # no write would ever pass again.
            try:
                await producer.send(topic, _job())
            except PublishError as exc:
                outcomes.append(type(exc.__cause__).__name__)
                return False
            return True

        await until(accepted, "a write goes through after the refusal")
        assert set(outcomes) <= {"MessageSizeTooLargeError", "OutOfOrderSequenceNumber"}
        assert await accepted(), outcomes
        assert await accepted(), outcomes
        written = await producer.send_many([(topic, _job()) for _ in range(10)])
        assert len(written) == 10
