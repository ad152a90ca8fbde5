"""The dashboard: server-rendered pages over the same tools as the JSON routes, one
module per page family (`common` is what they share). `routers` is every page's router,
in the order the app includes them."""

from __future__ import annotations

from fastapi import APIRouter

from stream_jobs.gateway.pages import (
    batches,
    dlq,
    history,
    job_search,
    jobs,
    login,
    outbox,
    overview,
    running,
    schedules,
    tenants,
    waiting,
)

routers: list[APIRouter] = [overview.router, login.router, dlq.router, jobs.router,
                            running.router, waiting.router, schedules.router, batches.router,
                            outbox.router, history.router, job_search.router, tenants.router]

__all__ = ["routers"]
