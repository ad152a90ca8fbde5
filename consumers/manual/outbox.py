# consumers/manual/outbox.py
"""The app of docs/outbox.md: an order placed in a web request's transaction, and the jobs
that follow it. The confirmation mail, the invoice and the stock reservation are
stand-ins: each notes that it ran."""

from pydantic import BaseModel

from stream_jobs import App, JobContext

app = App()


class OrderRef(BaseModel):
    order: int


@app.job("order.place")
async def place(job: OrderRef, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("UPDATE orders SET state = 'placed' WHERE id = $1", job.order)
        await ctx.enqueue("invoice.render", {"order": job.order})
        await ctx.enqueue("order.confirm", {"order": job.order}, name="confirmation")


@app.job("order.confirm")
@app.job("invoice.render")
@app.job("stock.reserve")
async def follow_up(job: OrderRef, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO order_jobs (job_id, job_type, order_id) "
                           "VALUES ($1, $2, $3)", ctx.job_id, ctx.job_type, job.order)
