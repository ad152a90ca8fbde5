"""The jobs a section drains: payloads of the bench's typical size, a backlog filled with
them, and the worker group rewound so that the same backlog is drained again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from ops.bench.common import Bench, BenchError, run_async
from stream_jobs.client import Job
from stream_jobs.naming import worker_group
from stream_jobs.settings import Settings

PAYLOAD_BYTES = 200
ENQUEUE_BATCH = 500


def _note_length() -> int:
    bare = orjson.dumps({"user": "user-00000000", "n": 0, "note": ""})
    return PAYLOAD_BYTES - len(bare) - 3  # `n` grows to a few digits


_NOTE = "x" * _note_length()


def payload(i: int) -> dict[str, Any]:
    """A job payload of about PAYLOAD_BYTES bytes of JSON (the bench's typical job)."""
    return {"user": f"user-{i:08d}", "n": i, "note": _NOTE}


def payload_bytes() -> int:
    return len(orjson.dumps(payload(123_456)))



async def fill(settings: Settings, job_type: str, n: int) -> float:
    """Enqueue `n` jobs with `enqueue_many` in batches of 500, each batch awaited before the
    next; returns the jobs per second."""
    from stream_jobs.app import App

    app = App(settings)
    async with app.client() as client:
        began = time.perf_counter()
        for i in range(0, n, ENQUEUE_BATCH):
            upto = min(n, i + ENQUEUE_BATCH)
            await client.enqueue_many(Job(job_type, payload(j)) for j in range(i, upto))
        return n / (time.perf_counter() - began)


async def rewind_worker_group(settings: Settings, job_type: str) -> None:
    """Commit offset 0 for the type's worker group, so the same backlog is drained again."""
    from stream_jobs.tools.group_offsets import reset_offsets

    group = worker_group(settings.topic_prefix, job_type)
    for _ in range(30):  # the group is empty once the last member's LeaveGroup landed
        try:
            await reset_offsets(settings, group, to_earliest=True)
            return
        except Exception as exc:
            if "member" not in str(exc):
                raise
            await asyncio.sleep(0.5)
    raise BenchError(f"group {group} kept members; could not rewind it")



def new_backlog(b: Bench, job_type: str, n: int, timeout_s: float = 600.0) -> float:
    """Declare `job_type` on the run's prefix and fill it with `n` jobs: the fill's jobs/s."""
    run_async(b.declare(job_type), 60)
    return run_async(fill(b.settings(), job_type, n), timeout_s)
