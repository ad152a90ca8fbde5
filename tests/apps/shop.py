"""The shop app: `stream-jobs worker tests.apps.shop:app --type shop.order`.

Used by tests/integration/test_outbox_faults.py, which creates `effects(job_id)` in the
test's schema: the handler's effect, written through `ctx.once()`, without a unique
constraint, so a second effect of one job would be a second row.
"""

from __future__ import annotations

from stream_jobs.app import App
from stream_jobs.context import JobContext

app = App()


@app.job("shop.order", timeout=30, concurrency=32, ordering="unordered")
async def order(job: dict[str, int], ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO effects (job_id) VALUES ($1)", ctx.job_id)
