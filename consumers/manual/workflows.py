# consumers/manual/workflows.py
"""The app of docs/workflows.md: a video's chain (fetch, transcode, publish), and an
album's batch of resizes whose callbacks report on it and tell its followers."""

from typing import Any

from pydantic import BaseModel

from stream_jobs import App, Job, JobContext, PermanentError
from stream_jobs.workflows import BatchSummary

app = App()

# -- the chain: each step gets what the step before it returned --------------------------


class Fetch(BaseModel):
    url: str


class Transcode(BaseModel):
    preset: str


class Publish(BaseModel):
    channel: str


class TranscodeError(PermanentError):
    """A preset this transcoder has no codec for: no retry will find one."""


PRESETS = ("720p", "1080p")


@app.job("video.fetch")
async def fetch(job: Fetch, ctx: JobContext) -> dict[str, str]:
    return {"path": f"/videos/{ctx.job_id}/source.mov"}     # where the download went


@app.job("video.transcode")
async def transcode(job: Transcode, ctx: JobContext) -> dict[str, str]:
    fetched = ctx.parent_result            # what video.fetch returned: {"path": ...}
    if job.preset not in PRESETS:
        raise TranscodeError("codec not found")
    out_path = fetched["path"].replace("source.mov", f"{job.preset}.mp4")
    return {"path": out_path}


@app.job("video.publish", keep_result="7d")
async def publish(job: Publish, ctx: JobContext) -> dict[str, str]:
    path = ctx.parent_result["path"]
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO published (job_id, channel, path) VALUES ($1, $2, $3)",
                           ctx.job_id, job.channel, path)
    return {"url": f"https://videos.example.com/{job.channel}{path}"}


# -- the batch: its callbacks get the counts under "batch" -------------------------------


class Resize(BaseModel):
    image: str


class AlbumReady(BaseModel):
    album: str
    followers: list[str]
    batch: BatchSummary | None = None      # filled in when the callback is written


class AlbumDone(BaseModel):
    album: str
    batch: BatchSummary | None = None


class Notify(BaseModel):
    user: str
    album: str


@app.job("img.resize")
async def resize(job: Resize, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO thumbnails (job_id, image) VALUES ($1, $2)",
                           ctx.job_id, job.image)


@app.job("album.ready")
async def ready(job: AlbumReady, ctx: JobContext) -> None:
    assert job.batch is not None           # failed is 0: on_success waits for every member
    async with ctx.once() as conn:
        await record(conn, ctx, job.album, job.batch)
        await ctx.batch([Job("album.notify", {"user": u, "album": job.album})
                         for u in job.followers],
                        on_complete=Job("album.notified", {"album": job.album}))


@app.job("album.report")                   # on_complete of the album's batch
@app.job("album.notified")                 # on_complete of album.ready's batch
async def done(job: AlbumDone, ctx: JobContext) -> None:
    assert job.batch is not None           # a callback's summary is always filled in
    async with ctx.once() as conn:
        await record(conn, ctx, job.album, job.batch)


@app.job("album.notify")
async def notify(job: Notify, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO notifications (job_id, user_id, album) "
                           "VALUES ($1, $2, $3)", ctx.job_id, job.user, job.album)


async def record(conn: Any, ctx: JobContext, album: str, batch: BatchSummary) -> None:
    """A callback's effect: one row with the counts it was given."""
    await conn.execute(
        "INSERT INTO album_events (job_id, event, album, total, succeeded, failed) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        ctx.job_id, ctx.job_type, album, batch.total, batch.succeeded, batch.failed)
