"""Shadow mode on the real stack: it counts every lane record by lane and partition, runs
no handler, leaves the worker group's offsets alone, and `stats` sets its counts next to
the real workers'."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.client import Job, JobClient
from stream_jobs.context import JobContext
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.naming import lane_topic
from stream_jobs.runtime.shadow import Shadow
from stream_jobs.settings import Settings
from stream_jobs.tools.stats import collect

from .conftest import Declare

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))


class Item(BaseModel):
    n: int


async def test_shadow_counts_what_the_lanes_hold_and_runs_nothing(
        app: App, declare: Declare, settings: Settings) -> None:
    policy = await declare("shadow.check", partitions=3, priorities=["high", "default"],
                           retry_tiers=["1s"], max_attempts=1)
    ran: list[str] = []

    @app.job("shadow.check", concurrency=16)
    async def handle(job: Item, ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    async with app.client() as client:
        await client.enqueue_many([Job("shadow.check", Item(n=i),
                                       priority="high" if i % 4 == 0 else "default")
                                   for i in range(40)])
    # One job whose payload does not fit the model (a client without models sends it),
    # and one record that is not a job at all.
    async with JobClient(settings, app.job_types()) as loose:
        await loose.enqueue("shadow.check", {"n": "not a number"})
    async with JobProducer(settings) as producer:
        await producer.send_raw(lane_topic(settings.topic_prefix, "shadow.check"), b"k",
                                b"{not json", [])

    shadow = Shadow(settings, policy, app.handler("shadow.check"), report_interval_s=1)
    await shadow.run(until_idle=True)

    assert ran == []
    before = (await collect(settings, app.job_types(), per_partition=True)).types[0]
    # Every lane partition: what the shadow counted is what the lane holds.
    holds = {(lane.name, p.partition): p.end - p.beginning
             for lane in before.lanes for p in lane.partitions}
    seen = shadow.seen()
    counted = {(lane, part): s.valid + s.undecodable
               for lane, parts in seen.items() for part, s in parts.items()}
    assert counted == {where: n for where, n in holds.items() if n}
    assert sum(s.valid for s in seen["high"].values()) == 10
    assert sum(s.valid for s in seen["default"].values()) == 30
    assert dict(shadow.undecodable_reasons) == {"invalid-payload": 1, "missing-header": 1}
    # The real group never committed anything: its lag is the whole lane.
    assert all(p.committed is None for lane in before.lanes for p in lane.partitions)
    assert before.lag == 42
    assert before.rates.counts.total == 0

    compared = before.shadow
    assert compared is not None
    assert compared.group == f"{settings.topic_prefix}.shadow.check.shadow"
    assert (compared.lag, compared.window_seen, compared.window_undecodable) == (0, 42, 2)
    assert compared.worker_processed == 0
    assert {lane.name: (lane.valid, lane.undecodable) for lane in compared.lanes} == {
        "high": (10, 0), "default": (30, 2)}
    assert compared.shadows == ()  # it stopped, and its last report said so

    # The real workers then process the same records: the counts line up.
    await app.worker("shadow.check", report_interval_s=1).run(until_idle=True)
    assert len(ran) == 40
    after = (await collect(settings, app.job_types())).types[0]
    assert after.lag == 0
    assert after.shadow is not None
    assert after.shadow.worker_processed == after.shadow.window_seen == 42
    assert after.to_dict(per_partition=False)["shadow"]["window"] == {
        "seen": 42, "undecodable": 2, "worker_processed": 42}



async def test_the_worker_command_runs_a_shadow(declare: Declare, settings: Settings,
                                                schema: str) -> None:
    await declare("email.send", partitions=2, retry_tiers=["1s"])
    types = load_job_types(settings.topics_dir)
    assert (await collect(settings, types)).types[0].shadow is None  # none ran yet
    async with JobClient(settings, types) as client:
        for i in range(5):
            await client.enqueue("email.send", {"to": f"u{i}@example.com", "subject": "hi"})
    env = {**os.environ, "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "STREAM_JOBS_DATABASE_URL": settings.database_url,
           "STREAM_JOBS_DATABASE_SCHEMA": schema,
           "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
           "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir), "COLUMNS": "200"}
    # The demo's handler would fail here (its tables do not exist in this schema) and
    # send the jobs to the delay tier: a shadow must not run it.
    proc = await asyncio.create_subprocess_exec(
        CLI, "worker", "consumers.demo:app", "--type", "email.send", "--shadow",
        "--until-idle", cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = " ".join(out.decode().split())
    assert proc.returncode == 0, text
    assert "stopped: 5 valid, 0 undecodable" in text
    shot = (await collect(settings, types, per_partition=True)).types[0]
    assert shot.lag == 5  # the worker group: untouched
    assert all(p.committed is None for lane in shot.lanes for p in lane.partitions)
    assert (sum(t.lag for t in shot.tiers), shot.dlq_depth) == (0, 0)
    assert shot.shadow is not None
    assert (shot.shadow.lag, shot.shadow.window_seen) == (0, 5)
