# consumers/manual/schedules.py
"""docs/schedules.md: digest.send's handler, and a schedule whose payload is made in code."""

from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from stream_jobs import App, JobContext
from stream_jobs.job_ids import job_id_time_ms

app = App()


class Digest(BaseModel):
    scope: str = "all"
    since: str | None = None


@app.job("digest.send", keep_result="1d")
async def send_digest(job: Digest, ctx: JobContext) -> dict[str, str | None]:
    fired_ms = job_id_time_ms(ctx.job_id) or 0      # a firing's fire time, from its ID
    fired = datetime.fromtimestamp(fired_ms / 1000, UTC)
    # ... gather what changed in `job.scope` since `job.since` and mail it ...
    return {"scope": job.scope, "since": job.since, "fire_time": fired.isoformat()}


@app.periodic("digest.send", name="hourly", cron="0 * * * *", timezone="Europe/Berlin")
def hourly_digest(fire_time: datetime) -> dict[str, str]:
    return {"since": (fire_time - timedelta(hours=1)).isoformat()}
