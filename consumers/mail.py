# consumers/mail.py
"""The tour's app: one handler for email.send, which succeeds, retries or dead-letters."""

from pydantic import BaseModel

from stream_jobs import App, JobContext, PermanentError

app = App()                       # settings from STREAM_JOBS_* environment variables

# The handler's effect table, in STREAM_JOBS_DATABASE_SCHEMA (step 2 of the tour creates it).
SCHEMA = "CREATE TABLE IF NOT EXISTS sent_emails (job_id text PRIMARY KEY, recipient text NOT NULL)"


class SendEmail(BaseModel):
    to: str
    subject: str


@app.job("email.send", timeout=30, concurrency=64, ordering="key")
async def send_email(job: SendEmail, ctx: JobContext) -> None:
    if "@" not in job.to:
        raise PermanentError("no such address")        # straight to the DLQ
    if job.subject == "flaky" and ctx.attempt == 1:
        raise RuntimeError("mail server busy")         # retried 5 s later, as attempt 2
    async with ctx.once() as conn:                     # dedup row + effect, one transaction
        await conn.execute("INSERT INTO sent_emails (job_id, recipient) VALUES ($1, $2)",
                           ctx.job_id, job.to)
