"""An app with one schedule declared in code, for `stream-jobs schedules trigger
tick.beat:stamped --app tests.apps.stamps:app` (tests/integration/test_schedules.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from stream_jobs.app import App

app = App()


@app.periodic("tick.beat", name="stamped", cron="0 3 * * *", timezone="Europe/Berlin")
async def stamped(fire_time: datetime) -> dict[str, Any]:
    """The fire time it was given, so a test can compare it with what the CLI printed."""
    return {"fire": fire_time.isoformat()}
