"""The transactional outbox on the real broker and Postgres: `enqueue(conn=...)` through
asyncpg, SQLAlchemy (async and sync), psycopg and Django's connection; a job exists if
and only if the caller's transaction commits; the relay; ordering across relays."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.errors import (
    ConfigError,
    NotInTransaction,
    OutboxWriteError,
    PayloadError,
    PayloadTooLarge,
    UnknownJobType,
)
from stream_jobs.naming import lane_topic
from stream_jobs.outbox.depth import read_depth
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.record import decode_record
from stream_jobs.settings import Settings
from tests.integration.conftest import Declare
from tests.integration.database import connect
from tests.integration.topic_reader import read_topic
from tests.waiting import until

TYPE = "order.placed"


class Placed(BaseModel):
    order: int


async def job_ids_in(settings: Settings, topic: str) -> list[str]:
    return [decode_record(key=r.key, value=r.value, headers=r.headers, expected_type=TYPE,
                          max_payload_bytes=1 << 20).job_id
            for r in await read_topic(settings, topic)]


async def outbox_rows(settings: Settings) -> int:
    return (await read_depth(settings)).depth


@pytest.fixture
async def orders(app: App, declare: Declare, settings: Settings) -> App:
    await declare(TYPE, partitions=3, priorities=["high", "default"])
    conn = await connect(settings)
    await conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    await conn.close()

    @app.job(TYPE)
    async def placed(job: Placed, ctx: Any) -> None:  # registered for its model only
        raise AssertionError("not run here")

    return app


async def test_a_job_exists_iff_the_transaction_commits(orders: App, settings: Settings) -> None:
    topic = lane_topic(settings.topic_prefix, TYPE)
    client = orders.client()  # never entered: writing through conn= needs no Kafka
    conn = await connect(settings)
    try:
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (1)")
            committed = await client.enqueue(TYPE, Placed(order=1), conn=conn, key="o-1")
            # The ID is there at once, and nothing is visible outside the transaction.
            assert committed
            assert await outbox_rows(settings) == 0
        tx = conn.transaction()
        await tx.start()
        await conn.execute("INSERT INTO orders VALUES (2)")
        await client.enqueue_many([Job(TYPE, {"order": 2}), Job(TYPE, {"order": 3})], conn=conn)
        await tx.rollback()  # the request failed
        async with conn.transaction():
            sentinel = await client.enqueue(TYPE, {"order": 4}, conn=conn)
    finally:
        await conn.close()
    assert await outbox_rows(settings) == 2
    async with OutboxRelay(settings) as relay:
        assert await relay.drain() == 2
    assert await outbox_rows(settings) == 0
    # The rolled-back jobs never reached Kafka, not even briefly: only the two committed
    # ones are in the topic, and the sentinel written after the rollback was relayed.
    assert sorted(await job_ids_in(settings, topic)) == sorted([committed, sentinel])


async def test_the_relayed_record_is_the_one_enqueue_would_send(
        orders: App, settings: Settings) -> None:
    client = orders.client()
    conn = await connect(settings)
    try:
        async with conn.transaction():
            job_id = await client.enqueue(TYPE, {"order": 7}, conn=conn, key="user-7",
                                          priority="high", expires_in=3600, job_id="given-7")
        async with conn.transaction():
            delayed = await client.enqueue(TYPE, {"order": 8}, conn=conn, delay=120)
    finally:
        await conn.close()
    async with OutboxRelay(settings) as relay:
        await relay.drain()
    [record] = await read_topic(settings, lane_topic(settings.topic_prefix, TYPE, "high"))
    assert record.key == b"user-7"
    assert record.value == b'{"order":7}'
    job = decode_record(key=record.key, value=record.value, headers=record.headers,
                        expected_type=TYPE, max_payload_bytes=1 << 20)
    assert (job.job_id, job.lane, job.attempt) == (job_id, "high", 1) == ("given-7", "high", 1)
    assert job.expires_at_ms is not None
    assert job.expires_at_ms - job.enqueued_at_ms == 3_600_000
    # A delay routes the row to the delay tier that fits, as a direct enqueue does.
    [held] = await read_topic(settings, f"{settings.topic_prefix}.{TYPE}.retry-1m")
    assert dict(held.headers)["sj-job-id"] == delayed.encode()
    assert "sj-not-before" in dict(held.headers)


async def test_every_check_happens_before_the_row_is_written(
        orders: App, settings: Settings) -> None:
    client = orders.client()
    conn = await connect(settings)
    try:
        async with conn.transaction():
            with pytest.raises(UnknownJobType):
                await client.enqueue("no.such.type", {}, conn=conn)
            with pytest.raises(ConfigError, match="lane"):
                await client.enqueue(TYPE, {"order": 1}, conn=conn, priority="low")
            with pytest.raises(PayloadError, match="does not fit Placed"):
                await client.enqueue(TYPE, {"order": "x"}, conn=conn)
            with pytest.raises(PayloadTooLarge):
                await client.enqueue(TYPE, {"order": 1, "pad": "x" * (1 << 20)}, conn=conn)
            with pytest.raises(PayloadError):  # one bad job: none of the batch is written
                await client.enqueue_many([Job(TYPE, {"order": 1}), Job(TYPE, {"order": "y"})],
                                          conn=conn)
            # The transaction is still usable: no statement of ours failed in it.
            await conn.execute("INSERT INTO orders VALUES (9)")
        assert await conn.fetchval("SELECT count(*) FROM stream_jobs_outbox") == 0
    finally:
        await conn.close()


async def test_autocommit_and_foreign_connections_are_refused(
        orders: App, settings: Settings) -> None:
    client = orders.client()
    conn = await connect(settings)
    try:
        with pytest.raises(NotInTransaction, match=r"conn\.transaction\(\)"):
            await client.enqueue(TYPE, {"order": 1}, conn=conn)
        with pytest.raises(TypeError, match="SyncJobClient takes SQLAlchemy Sessions"):
            await client.enqueue(TYPE, {"order": 1}, conn=object())
        sync = orders.sync_client()
        async with conn.transaction():
            with pytest.raises(TypeError, match=r"JobClient \(async\) takes asyncpg"):
                sync.enqueue(TYPE, {"order": 1}, conn=conn)
        assert await conn.fetchval("SELECT count(*) FROM stream_jobs_outbox") == 0
    finally:
        await conn.close()


async def test_a_schema_without_the_table_gets_one_sentence(
        orders: App, settings: Settings) -> None:
    elsewhere = App(settings.model_copy(update={"database_schema": "no_outbox_here"}))
    conn = await connect(settings)
    try:
        with pytest.raises(OutboxWriteError, match="run `stream-jobs db migrate` against it"):
            async with conn.transaction():
                await elsewhere.client().enqueue(TYPE, {"order": 1}, conn=conn)
    finally:
        await conn.close()


async def test_sqlalchemy_async_connection_and_session(orders: App, settings: Settings) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(settings.database_url.replace("postgresql://",
                                                               "postgresql+asyncpg://", 1))
    client = orders.client()
    try:
        async with engine.connect() as conn:
            await conn.execute(text(f'INSERT INTO "{settings.database_schema}".orders '
                                    "VALUES (1)"))
            first = await client.enqueue(TYPE, {"order": 1}, conn=conn)
            await conn.commit()
            await client.enqueue(TYPE, {"order": 2}, conn=conn)
            await conn.rollback()
        async with AsyncSession(engine) as session, session.begin():
            second = await client.enqueue_many([Job(TYPE, {"order": 3})], conn=session)
        async with AsyncSession(engine) as session:
            await client.enqueue(TYPE, {"order": 4}, conn=session)
            # closed without a commit: rolled back
        autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        async with autocommit.connect() as conn:
            with pytest.raises(NotInTransaction, match="AUTOCOMMIT"):
                await client.enqueue(TYPE, {"order": 5}, conn=conn)
    finally:
        await engine.dispose()
    async with OutboxRelay(settings) as relay:
        await relay.drain()
    topic = lane_topic(settings.topic_prefix, TYPE)
    assert sorted(await job_ids_in(settings, topic)) == sorted([first, *second])


def _sync_writes(orders: App, settings: Settings) -> list[str]:
    """SQLAlchemy's Session and Connection, and psycopg's own connection, on the calling
    thread, as a Flask view would."""
    import psycopg
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    client = orders.sync_client()  # not entered: no Kafka connection at all
    engine = create_engine(settings.database_url.replace("postgresql://",
                                                         "postgresql+psycopg://", 1))
    kept: list[str] = []
    try:
        with Session(engine) as session, session.begin():
            session.execute(text(f'INSERT INTO "{settings.database_schema}".orders VALUES (1)'))
            kept.append(client.enqueue(TYPE, {"order": 1}, conn=session))
        with Session(engine) as session:
            client.enqueue(TYPE, {"order": 2}, conn=session)
            session.rollback()
        with engine.begin() as conn:
            kept += client.enqueue_many([Job(TYPE, {"order": 3}), Job(TYPE, {"order": 4})],
                                        conn=conn)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn, \
                pytest.raises(NotInTransaction):
            client.enqueue(TYPE, {"order": 5}, conn=conn)
    finally:
        engine.dispose()
    with psycopg.connect(settings.database_url) as pg:  # autocommit off: one transaction
        kept.append(client.enqueue(TYPE, {"order": 6}, conn=pg))
        pg.commit()
        client.enqueue(TYPE, {"order": 7}, conn=pg)
        pg.rollback()
    with psycopg.connect(settings.database_url, autocommit=True) as pg:
        with pytest.raises(NotInTransaction, match="autocommit"):
            client.enqueue(TYPE, {"order": 8}, conn=pg)
        with pg.transaction():
            kept.append(client.enqueue(TYPE, {"order": 9}, conn=pg))
    return kept


async def test_sync_sqlalchemy_and_psycopg(orders: App, settings: Settings) -> None:
    kept = await asyncio.to_thread(_sync_writes, orders, settings)
    async with OutboxRelay(settings) as relay:
        await relay.drain()
    topic = lane_topic(settings.topic_prefix, TYPE)
    assert sorted(await job_ids_in(settings, topic)) == sorted(kept)
    assert len(kept) == 5


def _django_writes(orders: App, settings: Settings) -> list[str]:
    """Django's own `django.db.connection`, configured in-process on the test database,
    in `transaction.atomic()` as a view (or ATOMIC_REQUESTS) runs."""
    from urllib.parse import urlsplit

    import django
    from django.conf import settings as django_settings
    from django.db import connection, transaction

    if not django_settings.configured:
        dsn = urlsplit(settings.database_url)
        django_settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.postgresql",
                                   "HOST": dsn.hostname, "PORT": dsn.port,
                                   "NAME": dsn.path.lstrip("/"), "USER": dsn.username,
                                   "PASSWORD": dsn.password or ""}},
            INSTALLED_APPS=[], USE_TZ=True)
        django.setup()
    client = orders.sync_client()
    kept: list[str] = []
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f'INSERT INTO "{settings.database_schema}".orders VALUES (1)')
            kept.append(client.enqueue(TYPE, {"order": 1}, conn=connection))
        with transaction.atomic():
            client.enqueue(TYPE, {"order": 2}, conn=connection)
            transaction.set_rollback(True)  # the view failed
        with pytest.raises(NotInTransaction, match=r"transaction\.atomic"):
            client.enqueue(TYPE, {"order": 3}, conn=connection)  # Django's autocommit mode
    finally:
        connection.close()
    return kept


async def test_django_connection_in_atomic(orders: App, settings: Settings) -> None:
    kept = await asyncio.to_thread(_django_writes, orders, settings)
    async with OutboxRelay(settings) as relay:
        await relay.drain()
    topic = lane_topic(settings.topic_prefix, TYPE)
    assert await job_ids_in(settings, topic) == kept


async def test_one_keys_rows_reach_their_partition_in_order_across_relays(
        orders: App, settings: Settings) -> None:
    """Three relays with small batches share 1,500 rows of 5 keys written by 15
    transactions; each key's records are in the order they were written, also when a
    relay holds earlier rows of a key while another claims later ones."""
    client = orders.client()
    conn = await connect(settings)
    try:
        for t in range(15):
            async with conn.transaction():
                await client.enqueue_many(
                    [Job(TYPE, {"order": t * 100 + i}, key=f"k{i % 5}") for i in range(100)],
                    conn=conn)
    finally:
        await conn.close()
    relays = [OutboxRelay(settings, batch_max=37) for _ in range(3)]
    for relay in relays:
        await relay.connect()
    first, second = relays[:2]
    # The first relay claims the 37 oldest rows and is held before it sends them.
    gate = asyncio.Event()
    sending = first._send

    async def held_at_the_gate(rows: Any) -> Any:
        await gate.wait()
        return await sending(rows)

    first._send = held_at_the_gate  # type: ignore[method-assign]
    try:
        held_round = asyncio.create_task(first.relay_once())
        await until(lambda: first.rounds == 1, "the first relay claimed its rows")
        # The second claims the next 37; every key of them has an earlier row that the
        # first holds, so it sends none of them yet.
        blocked = await second.relay_once()
        assert (blocked.claimed, blocked.sent, blocked.held) == (37, 0, 37)
        gate.set()
        assert (await held_round).sent == 37
        moved = await asyncio.gather(*(relay.drain() for relay in relays))
    finally:
        gate.set()  # a failed assertion above must not leave the first round holding on
        for relay in relays:
            await relay.close()
    assert sum(moved) == 1500 - 37
    records = await read_topic(settings, lane_topic(settings.topic_prefix, TYPE))
    assert len(records) == 1500  # no row was sent twice: nothing failed
    by_key: dict[bytes, list[int]] = {}
    for record in records:  # partition order, then offset order
        by_key.setdefault(record.key, []).append(int(record.value.split(b":")[1][:-1]))
    assert len(by_key) == 5
    for key, orders_seen in by_key.items():
        assert orders_seen == sorted(orders_seen), f"{key!r} out of order"


async def test_stats_and_status_show_the_outbox(orders: App, settings: Settings) -> None:
    import subprocess
    import sys
    from pathlib import Path

    import orjson

    from stream_jobs.tools.stats import collect
    from tests.integration.cli_env import settings_env

    client = orders.client()
    conn = await connect(settings)
    try:
        async with conn.transaction():
            await client.enqueue_many([Job(TYPE, {"order": i}) for i in range(3)], conn=conn)
    finally:
        await conn.close()
    shot = await collect(settings, orders.job_types())
    assert shot.outbox is not None
    assert (shot.outbox.depth, shot.outbox.retrying) == (3, 0)
    assert shot.outbox.oldest_age_s is not None
    assert shot.outbox.oldest_age_s >= 0
    cli = str(Path(sys.executable).with_name("stream-jobs"))
    env = settings_env(settings)
    done = await asyncio.to_thread(subprocess.run, [cli, "stats", "--json"], env=env,
                                   capture_output=True, check=True)
    assert orjson.loads(done.stdout)["outbox"]["depth"] == 3
    done = await asyncio.to_thread(subprocess.run, [cli, "outbox", "status"], env=env,
                                   capture_output=True, text=True, check=True)
    assert "3 rows waiting" in done.stdout
    # A database without the table: the types' stats still show, the outbox as unknown.
    elsewhere = settings.model_copy(update={"database_schema": "no_outbox_here"})
    shot = await collect(elsewhere, orders.job_types())
    assert shot.outbox is None
    assert shot.outbox_problem is not None
    assert "db migrate" in shot.outbox_problem
    assert shot.types[0].job_type == TYPE
