# consumers/manual/results.py
"""The app of docs/results.md: report.build keeps what it returns for a day."""

from pydantic import BaseModel

from stream_jobs import App, JobContext, PermanentError

app = App()


class Report(BaseModel):
    owner: str


class ReportResult(BaseModel):
    pages: int
    url: str


@app.job("report.build", keep_result="1d")
async def build(job: Report, ctx: JobContext) -> ReportResult:
    if not job.owner.startswith("u-"):
        raise PermanentError(f"no such owner: {job.owner}")     # dead-lettered at once
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO reports (job_id, owner) VALUES ($1, $2)",
                           ctx.job_id, job.owner)
    return ReportResult(pages=12, url=f"/reports/{ctx.job_id}.pdf")
