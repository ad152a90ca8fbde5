"""The app of the LISTEN trial (ops/chaos/listen_trial.py): `stream-jobs worker
ops.chaos.listen_app:app`.

`chaos.listen` keeps its result. A `hold` job waits (up to `HOLD_S`) until a cancel
interrupts it, and appends `<job ID> <epoch s>` to the file `INTERRUPTS_ENV` names when it
is; a `work` job writes its effect row through `ctx.once()` and returns twice its number.
`listen_effects` has no unique constraint: an effect that happened twice shows twice.
"""

from __future__ import annotations

import asyncio
import os
import time

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.settings import Settings

LISTEN_TYPE = "chaos.listen"
INTERRUPTS_ENV = "LISTEN_INTERRUPTS_FILE"
HOLD_S = 300.0  # a hold job not interrupted by then returns "held"
TABLES = ("CREATE TABLE listen_effects (job_id text NOT NULL, n int NOT NULL)",)


def make_app(settings: Settings | None = None) -> App:
    """The trial's app; `settings` for the runner's client (the workers read theirs)."""
    app = App(settings)

    @app.job(LISTEN_TYPE, timeout=HOLD_S + 30, concurrency=32, keep_result="1h")
    async def listen(job: dict[str, object], ctx: JobContext) -> object:
        n = int(str(job["n"]))
        if job["kind"] == "hold":
            _note("started", ctx.job_id)
            try:
                await asyncio.sleep(HOLD_S)  # until a cancel interrupts it
            except asyncio.CancelledError:
                _note("interrupted", ctx.job_id)
                raise
            return "held"
        async with ctx.once() as tx:
            await tx.execute("INSERT INTO listen_effects (job_id, n) VALUES ($1, $2)",
                             ctx.job_id, n)
        return n * 2

    return app


def _note(what: str, job_id: str) -> None:
    path = os.environ.get(INTERRUPTS_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {job_id} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)


app = make_app()
