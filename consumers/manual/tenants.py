# consumers/manual/tenants.py
"""docs/fairness.md: a customer's data export, and the mail that says it is ready. Each
handler reads the customer it works for as `ctx.tenant`; the mail, a child job started
without a tenant, takes the export's."""

from pydantic import BaseModel

from stream_jobs import App, JobContext

app = App()


class Export(BaseModel):
    dataset: str


@app.job("export.build")
async def build(job: Export, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO exports (job_id, tenant, step) VALUES ($1, $2, $3)",
                           ctx.job_id, ctx.tenant, f"build {job.dataset}")
        await ctx.enqueue("export.notify", {"dataset": job.dataset})


@app.job("export.notify")
async def notify(job: Export, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO exports (job_id, tenant, step) VALUES ($1, $2, $3)",
                           ctx.job_id, ctx.tenant, f"mail {job.dataset}")
