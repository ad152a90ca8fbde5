"""Stopping a consumer whose fetcher has a fetch waiting out its backoff (a broker
connection broke a moment before): aiokafka's fetcher cancels that task and re-raises its
cancellation (aio-libs/aiokafka#647). Seen in the `results@cluster` chaos trial, where it
ended `client.result()` with a bare CancelledError after its lookup's scan had finished."""

from __future__ import annotations

import asyncio

import pytest

from stream_jobs.kafka.consumer import open_reader
from stream_jobs.settings import Settings

pytestmark = pytest.mark.integration


async def test_a_stop_during_a_fetch_backoff_closes_and_does_not_raise(settings: Settings
                                                                      ) -> None:
    backoff = None
    async with open_reader(settings) as consumer:
        await consumer.refresh_metadata()
        # What aiokafka's fetcher holds after a failed fetch: a task asleep in its backoff.
        backoff = asyncio.create_task(asyncio.sleep(30))
        fetcher = consumer._consumer._fetcher
        assert fetcher is not None
        fetcher._pending_tasks.add(backoff)
    assert backoff.cancelled()
    conns = consumer._consumer._client._conns.values()
    assert conns
    assert not any(conn.connected() for conn in conns)  # every one closed


async def test_a_caller_cancelled_during_the_stop_is_still_cancelled(settings: Settings
                                                                    ) -> None:
    started = asyncio.Event()

    async def read_then_stop() -> None:
        async with open_reader(settings) as consumer:
            await consumer.refresh_metadata()
            fetcher = consumer._consumer._fetcher
            fetcher._pending_tasks.add(asyncio.create_task(asyncio.sleep(30)))
            started.set()
            await asyncio.sleep(30)  # cancelled here, so the stop runs while cancelling

    task = asyncio.create_task(read_then_stop())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

