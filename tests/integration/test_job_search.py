"""Finding jobs by their Kafka key on the real stack (`find_by_key`, `stream-jobs job
--key K --type T`): every job whose records carry the key, none of the others, the cap
said when a scan stops at it; and `stream-jobs retry-now`'s one-sentence refusal."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.lookup.by_key import find_by_key
from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env

from .conftest import Declare

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))


async def _cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=ROOT, env=settings_env(settings, COLUMNS="80"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_jobs_with_a_key_are_found_in_the_types_topics(app: App,
                                                                 declare: Declare) -> None:
    policy = await declare("search.key", partitions=2, retry_tiers=["1h"])
    async with app.client() as client:
        mine = await client.enqueue_many(Job("search.key", {"i": i}, key="customer-7")
                                         for i in range(3))
        others = await client.enqueue_many(Job("search.key", {"i": i}, key=f"customer-{i}")
                                           for i in range(20, 25))
        later = await client.enqueue("search.key", {"later": True}, key="customer-7",
                                     delay=3600)  # waits in the tier: found there
    found = await find_by_key(app.settings, policy, "customer-7")
    assert [job.job_id for job in found.jobs] == [*mine, later]
    assert found.complete
    assert found.summary().startswith("4 jobs of type search.key with key 'customer-7'")
    assert not set(others) & {job.job_id for job in found.jobs}
    tier = next(job for job in found.jobs if job.job_id == later)
    assert tier.latest_topic.endswith(".retry-1h")

    capped = await find_by_key(app.settings, policy, "customer-7", max_records_per_topic=2)
    assert not capped.complete
    assert "read only the newest 2 records of a topic that holds more" in capped.summary()

    code, out, err = await _cli(app.settings, "job", "--key", "customer-7", "--type",
                                "search.key")
    assert code == 0, err
    assert all(job_id in out for job_id in [*mine, later])
    assert max(len(line) for line in out.splitlines()) <= 80
    code, out, err = await _cli(app.settings, "job", "--key", "customer-7", "--type",
                                "search.key", "--json")
    assert code == 0, err
    assert [job["job_id"] for job in orjson.loads(out)["jobs"]] == [*mine, later]
    code, out, err = await _cli(app.settings, "job", "--key", "customer-7")
    assert code == 1
    assert "--key needs --type" in err

    code, out, err = await _cli(app.settings, "retry-now", mine[0], "--type", "search.key")
    assert code == 1
    assert f"Job {mine[0]} is pending (or running), not waiting in a delay tier." in err
