# consumers/manual/sync_handlers.py
"""docs/sync-handlers.md: a plain `def` handler that renders an invoice's PDF on a thread."""

from pydantic import BaseModel
from sqlalchemy import create_engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from stream_jobs import App, JobContext, PermanentError

app = App()

# Your application's database. Here it is the one STREAM_JOBS_DATABASE_URL names, in the
# schema STREAM_JOBS_DATABASE_SCHEMA names, so a schema of your own holds everything.
DSN = app.settings.database_url
OPTIONS = f"-c search_path={app.settings.database_schema}"
engine = create_engine(make_url(DSN).set(drivername="postgresql+psycopg"),
                       connect_args={"options": OPTIONS})


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "invoices"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]
    total_cents: Mapped[int]


class RenderedPdf(Base):
    __tablename__ = "rendered_pdfs"
    invoice_id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[bytes]


class RenderPdf(BaseModel):
    invoice_id: int


def fetch_invoice(invoice_id: int) -> Invoice | None:
    with Session(engine) as session:
        return session.get(Invoice, invoice_id)


def make_pdf(invoice: Invoice) -> bytes:
    """Stands in for your PDF library: slow, blocking, not async."""
    return f"%PDF-1.7 invoice {invoice.id}, {invoice.customer}, {invoice.total_cents}".encode()


@app.job("pdf.render", timeout=60, concurrency=8)
def render(job: RenderPdf, ctx: JobContext) -> None:
    invoice = fetch_invoice(job.invoice_id)          # blocking I/O is fine here
    if invoice is None:
        raise PermanentError("no such invoice")      # straight to the DLQ, as in async code
    pdf = make_pdf(invoice)
    with Session(engine) as session, ctx.once_sync(session):
        session.add(RenderedPdf(invoice_id=job.invoice_id, body=pdf))
    # here the job's dedup row and the RenderedPdf row are committed together
