# consumers/manual/flow_control.py
"""docs/flow-control.md: newsletter.send, paced by its topics file and by `throttle`."""

from pydantic import BaseModel

from stream_jobs import App, JobContext

app = App()


class Newsletter(BaseModel):
    to: str
    issue: int


@app.job("newsletter.send", concurrency=16)
async def send_newsletter(job: Newsletter, ctx: JobContext) -> None:
    ...  # hand it to the mail provider, whose sending quota is the type's rate_limit
