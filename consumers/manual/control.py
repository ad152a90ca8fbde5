# consumers/manual/control.py
"""The app of docs/control.md: a shipment to cancel, a reminder sent once per user, a
wiki page indexed once per burst of edits. Each handler writes its effect through
`ctx.once()`, so a cancel is exact."""

from pydantic import BaseModel

from stream_jobs import App, JobContext

app = App()


class Shipment(BaseModel):
    order: int


class Reminder(BaseModel):
    user: str


class PageEdit(BaseModel):
    doc: str


@app.job("order.ship")
async def ship(job: Shipment, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO shipments (job_id, order_id) VALUES ($1, $2)",
                           ctx.job_id, job.order)


@app.job("reminder.send")
async def remind(job: Reminder, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO reminders (job_id, user_id) VALUES ($1, $2)",
                           ctx.job_id, job.user)


@app.job("wiki.index")
async def index(job: PageEdit, ctx: JobContext) -> None:
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO indexed (job_id, doc) VALUES ($1, $2)",
                           ctx.job_id, job.doc)
