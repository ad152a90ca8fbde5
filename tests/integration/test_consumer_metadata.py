"""How stale a consumer's view of partition leaders may get. aiokafka asks a newly
assigned partition's old leader for its offset again and again, without asking who leads
now, until its metadata is `metadata_max_age_ms` old (its default: 5 minutes): in the
batches@cluster chaos trial a worker's partition stood still 4 minutes after a broker
kill. Our consumers refresh it every 10 s (stream_jobs/kafka/consumer.py)."""

from __future__ import annotations

import pytest

from stream_jobs.kafka.consumer import METADATA_MAX_AGE_MS, open_reader
from stream_jobs.settings import Settings

pytestmark = pytest.mark.integration


async def test_a_consumer_asks_who_leads_its_partitions_every_10_s(settings: Settings) -> None:
    async with open_reader(settings) as consumer:
        assert consumer._consumer._client._metadata_max_age_ms == METADATA_MAX_AGE_MS
    assert METADATA_MAX_AGE_MS <= 10_000
