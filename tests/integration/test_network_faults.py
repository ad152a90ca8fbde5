"""The network between the parts misbehaves: Toxiproxy (ops/chaos/netproxy.py, built by
ops/toxiproxy/build.sh) between a worker and Postgres or Kafka. The CI-sized part of
`make chaos`'s network scenarios (docs/faults/index.md).

- The LISTEN connections (the cancel watch, the outbox relay's, result waits) go silent
  while the rest works: their probe finds it, a cancel sent into the silence still
  interrupts its job once the link is back, the relay goes on relaying by its sweep, and
  `client.result()` returns without waiting for its timeout.
- Postgres hangs under a handler inside `ctx.once()`: the run ends at its timeout, nothing
  is committed for it, and once Postgres answers again the job runs once.
- A broker's link blackholed: the worker's jobs wait, then each runs once.

The probe's cadence is shortened here (1 s + 1 s instead of 5 s + 5 s) to keep the tests
short; the faults are real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ops.chaos.netproxy import HOST, Link, NetProxy, _with_port
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import ResultTimeout
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.postgres import listening
from stream_jobs.settings import Settings
from tests.waiting import until

from .conftest import Declare

PROBE_S = 1.0  # the probe's interval and timeout here


@pytest.fixture
async def proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[NetProxy]:
    monkeypatch.setattr(listening, "LISTEN_PROBE_INTERVAL_S", PROBE_S)
    monkeypatch.setattr(listening, "LISTEN_PROBE_TIMEOUT_S", PROBE_S)
    server = await NetProxy(Settings().stack_dir, tmp_path / "toxiproxy").start()
    try:
        yield server
    finally:
        server.stop()


async def _pg_link(proxy: NetProxy, settings: Settings, name: str) -> Link:
    return await proxy.link(name, f"{HOST}:{settings.dev_postgres_port}")


def _via(app: App, **update: str) -> App:
    """The same handlers' App on settings that reach a part through the proxy."""
    app.settings = app.settings.model_copy(update=update)
    return app


async def test_a_cancel_sent_into_a_silent_listen_link_interrupts_its_job_once_it_returns(
        app: App, declare: Declare, proxy: NetProxy) -> None:
    await declare("net.cancel", partitions=1)
    direct = app.settings
    link = await _pg_link(proxy, direct, "listen")
    _via(app, database_listen_url=_with_port(direct.database_url, link.listen))
    started = asyncio.Event()
    stopped: list[float] = []

    @app.job("net.cancel", concurrency=1)
    async def wait_forever(job: dict[str, Any], ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.append(time.monotonic())

    async with app.client() as client:
        job_id = await client.enqueue("net.cancel", {})
        worker = app.worker("net.cancel")
        feed = worker.admission.watch
        assert feed is not None
        watch = feed.watch  # type: ignore[attr-defined]
        running = asyncio.create_task(worker.run(until_idle=True))
        try:
            await asyncio.wait_for(started.wait(), 30)
            await link.blackhole()
            # The NOTIFY goes into the silent link and is lost there.
            answer = await client.cancel(job_id)
            assert answer.changed, answer
            await until(lambda: watch.silent_links >= 1,
                        "the probe to find the LISTEN connection silent", 4 * PROBE_S + 5)
            assert not stopped, "the job was interrupted while the link was silent"
            await link.clear()
            healed = time.monotonic()
            await until(lambda: bool(stopped), "the job to be interrupted after the link "
                        "returned", 15)
        finally:
            await link.clear()
            await asyncio.wait_for(running, 60)
    # The bound docs/control.md states: the watch's backoff (at most 5 s) and a reload.
    assert stopped[0] - healed < 6.0, stopped[0] - healed


async def test_the_relay_and_result_waits_go_on_while_their_listen_link_is_silent(
        app: App, declare: Declare, proxy: NetProxy) -> None:
    await declare("net.result", partitions=1)
    direct = app.settings
    link = await _pg_link(proxy, direct, "listen")
    _via(app, database_listen_url=_with_port(direct.database_url, link.listen))
    go = asyncio.Event()

    @app.job("net.result", keep_result="1h")
    async def double(job: dict[str, Any], ctx: JobContext) -> int:
        await go.wait()
        return int(job["n"]) * 2

    stop = asyncio.Event()
    relay = OutboxRelay(app.settings, sweep_interval_s=1.0)
    relaying = asyncio.create_task(relay.run(stop))
    worker = app.worker("net.result")
    running = asyncio.create_task(worker.run())
    try:
        async with app.client() as client:
            first = await client.enqueue("net.result", {"n": 1})
            # A first wait runs out while the job is held: the waits' listener is up.
            with pytest.raises(ResultTimeout):
                await client.result(first, timeout=2 * PROBE_S)
            waiting = asyncio.create_task(client.result(first, timeout=60))
            await until(lambda: relay.rounds > 0, "the relay's first round")
            await link.blackhole()
            conn = await asyncpg.connect(direct.database_url, server_settings={
                "search_path": direct.database_schema})
            try:
                async with conn.transaction():
                    second = await client.enqueue("net.result", {"n": 21}, conn=conn)
            finally:
                await conn.close()
            reader = client._stores._results  # type: ignore[attr-defined]
            await until(lambda: reader.silent_links >= 1,
                        "the probe to find the result waits' listener silent", 4 * PROBE_S + 5)
            # Past the wait's first lookup: only the listener, or reads while it is
            # down, can bring the result now.
            go.set()
            began = time.monotonic()
            assert await asyncio.wait_for(waiting, 30) == 2
            assert time.monotonic() - began < 5.0
            # The relay's wake-up is lost too; its sweep moves the row meanwhile.
            assert await client.result(second, timeout=30) == 42
            assert link.toxics, "the link was healed before the checks"
    finally:
        await link.clear()
        stop.set()
        await asyncio.wait_for(relaying, 30)
        worker.request_stop()
        await asyncio.wait_for(running, 60)
