"""A no-op app for one type, run as a worker process by tests/integration/test_flow_control.py:
`stream-jobs worker tests.apps.beats:app --type beat.check`."""

from __future__ import annotations

from typing import Any

from stream_jobs.app import App
from stream_jobs.context import JobContext

app = App()


@app.job("beat.check")
async def check(job: dict[str, Any], ctx: JobContext) -> None:
    """Does nothing: the test watches the heartbeats around it."""
