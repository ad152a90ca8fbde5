"""Faults paced by a trial's progress, shared by the trials of issue 28's features
(results, unique keys, history, the outbox relay) and the batches trial: SIGKILL a random
process each time another share of the jobs is done, and restart Postgres once on the
way; whether nothing is left to do; and the one-off queries their runners make.

The progress is whatever count the trial gives (`done`): rows of an effects table, of
kept results. A probe that fails while Postgres is down is a "not yet" (`faults.until`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncpg

from ops.chaos import faults
from ops.chaos.workers import WorkerGroup
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import open_admin
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.naming import relay_group, worker_group
from stream_jobs.outbox.depth import read_depth
from stream_jobs.settings import Settings
from stream_jobs.stack import PostgresServer

log = logging.getLogger("ops.chaos.paced")
PG_DOWN_S = 2.0  # how long the restart keeps Postgres stopped


async def fetch(settings: Settings, sql: str, *args: object) -> list[Any]:
    """The rows of one query in the run's schema, on a connection of its own."""
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def count(settings: Settings, sql: str) -> int:
    """The first column of the first row of `sql` (a `SELECT count(...)`)."""
    rows = await fetch(settings, sql)
    return int(rows[0][0])


async def restart_postgres(server: PostgresServer, down_s: float = PG_DOWN_S) -> None:
    """Stop Postgres (`-m fast`: sessions cut, open transactions rolled back), keep it down
    `down_s`, start it again."""
    log.info("restarting Postgres (down %.0f s)", down_s)
    await faults.stop_postgres(server)
    await asyncio.sleep(down_s)  # the outage's length
    await faults.start_postgres(server)


async def kill_per_share(group: WorkerGroup, done: Callable[[], Awaitable[int]], total: int,
                         kills: int, within_s: float, rng: random.Random, *,
                         postgres: PostgresServer | None = None,
                         after: Callable[[int], Awaitable[None]] | None = None) -> int:
    """SIGKILL a random member of `group` each time another 1/(kills + 1) of `total` is
    `done`, starting another each time; after the middle kill, restart `postgres` (when
    given); after kill k (from 1), `after(k)` (when given). The number of Postgres
    restarts."""
    restarts = 0
    for k in range(1, kills + 1):
        target = total * k // (kills + 1)

        async def reached(target: int = target) -> bool:
            return await done() >= target

        await faults.until(reached, within_s, f"{target} of {total} done")
        victim = rng.choice(group.live())
        log.info("kill -9 %s (pid %d) at %d of %d done", victim.name, victim.pid, target, total)
        group.kill(victim)
        group.start()
        if postgres is not None and k == (kills + 1) // 2:
            await restart_postgres(postgres)
            restarts += 1
        if after is not None:
            await after(k)
    return restarts


async def stop_all(group: WorkerGroup) -> None:
    """SIGTERM every live member and wait for each to exit."""
    for worker in group.live():
        group.terminate(worker)
    for worker in group.members:
        await asyncio.to_thread(group.stopped, worker)


async def quiet(settings: Settings, policies: Iterable[JobTypePolicy]) -> bool:
    """The outbox is empty and every lane and tier is read to its end by its group."""
    if (await read_depth(settings)).depth:
        return False
    prefix = settings.topic_prefix
    async with open_reader(settings) as reader, open_admin(settings) as admin:
        for policy in policies:
            for group, topics in ((worker_group(prefix, policy.job_type),
                                   list(policy.lane_topics(prefix).values())),
                                  (relay_group(prefix, policy.job_type),
                                   list(policy.tier_topics(prefix).values()))):
                tps = [TopicPartition(t, p) for t in topics
                       for p in range(policy.partitions)]
                ends = await reader.end_offsets(tps)
                committed = await admin.committed_offsets(group, tps)
                if any(end > (committed.get(tp) or 0) for tp, end in ends.items()):
                    return False
    return True
