"""`/ui/types/{type}/tenants`: one type's top tenants by jobs waiting, in the overflow lane
and in flight, with their p95 dwell, the rest as one row (`stream_jobs.fairness.census`,
as `stream-jobs stats TYPE --tenants`), read at each request with a scan of at most
`TENANT_SCAN_RECORDS` records. Figures, no job or payload: open like `/`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from stream_jobs.gateway.pages.common import GatewayDep, page, session_of
from stream_jobs.gateway.sampler import TENANT_SCAN_RECORDS
from stream_jobs.tools.tenant_stats import collect_tenants

router = APIRouter(include_in_schema=False)


@router.get("/ui/types/{job_type}/tenants", response_class=HTMLResponse)
async def tenants_page(request: Request, job_type: str, gateway: GatewayDep) -> Response:
    census = await collect_tenants(gateway.settings, gateway.types, job_type,
                                   max_records=TENANT_SCAN_RECORDS)
    return page("tenants.html", census=census, job_type=job_type,
                fair=gateway.types[job_type].fairness is not None,
                session=session_of(request, gateway), current="/")


__all__ = ["router"]
