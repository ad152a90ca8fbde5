"""The doomed app: `stream-jobs worker tests.apps.doomed:app --type doomed.job`.

Used by tests/integration/test_dlq_counts.py. Every job fails: an even `n` permanently
(dead at once), an odd one for a retry through the type's tier, then dead. With
`DOOMED_HANG=1` a job whose payload says `hang` waits on its first attempt until the
worker is killed: the worker commits only the finished prefix of a partition, so every
job behind it stays uncommitted and a worker killed there leaves them to be run, and
dead-lettered, again.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError

app = App()

HANG = os.environ.get("DOOMED_HANG") == "1"


class Doom(BaseModel):
    n: int
    hang: bool = False


@app.job("doomed.job", timeout=600, concurrency=16, ordering="unordered")
async def doom(job: Doom, ctx: JobContext) -> None:
    if job.hang and HANG and ctx.attempt == 1:
        await asyncio.Event().wait()  # until the kill
    if job.n % 2 == 0:
        raise PermanentError(f"job {job.n} can never succeed")
    raise RuntimeError(f"job {job.n} cannot succeed")
