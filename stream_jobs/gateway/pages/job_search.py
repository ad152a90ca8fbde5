"""`/ui/jobs`: the overview's search box. A job ID goes to its page; `key:K` (or the
`key` field) lists the jobs of a type whose records carry the Kafka key K, found by a
bounded scan of the type's lanes, delay tiers and DLQ (`stream_jobs.lookup.by_key`),
each linked to its page. Listing jobs needs a signed-in session."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from stream_jobs.errors import StreamJobsError
from stream_jobs.gateway.pages.common import GatewayDep, page, session_of, to_login
from stream_jobs.job_types import get_job_type
from stream_jobs.lookup.by_key import MAX_KEY_BYTES, KeyMatches, find_by_key

router = APIRouter(include_in_schema=False)

KEY_PREFIX = "key:"
# A page answers within seconds: fewer records than the shell's default per topic.
PAGE_MAX_RECORDS_PER_TOPIC = 50_000


@router.get("/ui/jobs", response_class=HTMLResponse)
async def find_jobs(request: Request, gateway: GatewayDep, id: str | None = None,
                    key: str | None = None, type: str | None = None) -> Response:
    """A job ID: to its page. A key (`key=K`, or `id=key:K`) and a type: the jobs found."""
    wanted = (id or "").strip()
    if key is None and not wanted.startswith(KEY_PREFIX):
        target = f"/ui/jobs/{quote(wanted, safe='')}" if wanted else "/"
        return RedirectResponse(target, status_code=303)
    if (session := session_of(request, gateway)) is None:
        return to_login(request)
    key = key if key is not None else wanted[len(KEY_PREFIX):]
    declared = sorted(gateway.types)
    if not type and len(declared) == 1:
        type = declared[0]
    found: KeyMatches | None = None
    problem = None
    if not key or len(key.encode()) > MAX_KEY_BYTES:
        problem = f"A key to look for has 1 to {MAX_KEY_BYTES:,} bytes."
    elif not type:
        problem = "Choose the job type whose topics the key is looked for in."
    else:
        try:
            policy = get_job_type(gateway.types, type)
            found = await find_by_key(gateway.settings, policy, key,
                                      max_records_per_topic=PAGE_MAX_RECORDS_PER_TOPIC)
        except StreamJobsError as exc:
            problem = str(exc)
    return page("job_search.html", session=session, key=key, job_type=type or "",
                declared=declared, found=found, problem=problem, quote=quote,
                status_code=200 if problem is None or found is not None else 400)


__all__ = ["router"]
