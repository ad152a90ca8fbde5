"""The app the memory bench runs in its own process:
`stream-jobs worker ops.bench.apps:app --type bench.mem --until-idle`."""

from __future__ import annotations

from typing import Any

from stream_jobs.app import App
from stream_jobs.context import JobContext

app = App()


@app.job("bench.mem")
async def noop(job: dict[str, Any], ctx: JobContext) -> None:
    """Does nothing: what is measured is the worker around it."""
