"""The app of the results trial (ops/chaos/results_trial.py): `stream-jobs worker
ops.chaos.results_app:app`.

`chaos.result` keeps what its handler returns (`keep_result`), a value computed from the
payload alone (`result_for`), so the checker knows what every job's result must be. The
handler takes the three forms of the finish transaction (docs/results.md) by the job's
number: a third write their effect row through `ctx.once()` (the transaction held open
`RESULT_HOLD_MS`, so kills and the Postgres restart land inside it), a third through
`ctx.once_deferred()`, and a third neither (no effect row: the result alone is kept).
`result_effects` has no unique constraint: an effect that happened twice shows twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.settings import Settings

RESULT_TYPE = "chaos.result"
HOLD_MS_ENV = "RESULT_HOLD_MS"
TABLES = (
    "CREATE TABLE result_effects (job_id text NOT NULL, n int NOT NULL, "
    "attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
)
FORMS = ("once", "once_deferred", "neither")

_HOLD_S = int(os.environ.get(HOLD_MS_ENV, "3")) / 1000


def form_of(n: int) -> str:
    """How job `n` writes its effect: one of FORMS."""
    return FORMS[n % len(FORMS)]


def result_for(n: int) -> dict[str, object]:
    """What the handler returns for the payload `{"n": n}`: JSON, unlike for any other n."""
    return {"n": n, "square": n * n, "digest": hashlib.sha256(str(n).encode()).hexdigest()[:16],
            "form": form_of(n)}


def make_app(settings: Settings | None = None) -> App:
    """The trial's app; `settings` for the runner's client (the workers read theirs)."""
    app = App(settings)

    @app.job(RESULT_TYPE, timeout=30, concurrency=16, ordering="unordered", keep_result="1h")
    async def compute(job: dict[str, int], ctx: JobContext) -> dict[str, object]:
        n = job["n"]
        form = form_of(n)
        if form != "neither":
            once = ctx.once() if form == "once" else ctx.once_deferred()
            async with once as tx:
                await tx.execute("INSERT INTO result_effects (job_id, n, attempt) "
                                 "VALUES ($1, $2, $3)", ctx.job_id, n, ctx.attempt)
                if _HOLD_S and form == "once":
                    await asyncio.sleep(_HOLD_S)  # kills land while the transaction is open
        return result_for(n)

    return app


app = make_app()
