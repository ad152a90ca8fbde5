"""The gateway's JSON routes: enqueue, look a job up, cancel it, types and stats, the DLQ.

Write and operator routes (enqueue, job and batch lookup, cancel, DLQ list and requeue)
need the bearer token; types and stats are open. Errors are one sentence in `detail`: 401
no or wrong token, 404 unknown type, letter, job, batch or chain, 409 a cancel that waited
for a run which did not stop, 413 a payload or request over its limit, 422 a request that
cannot be a job, 503 (with Retry-After) Kafka or Postgres not answering.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.routing import APIRoute
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from stream_jobs.client import Job
from stream_jobs.clock import now_ms
from stream_jobs.dlq.letters import LetterRow, parse_since
from stream_jobs.dlq.listing import list_letters
from stream_jobs.dlq.requeue import SelectAll, SelectIds, Selection, SelectReason, requeue
from stream_jobs.errors import PayloadTooLarge, PublishError
from stream_jobs.gateway.auth import Authorized
from stream_jobs.gateway.state import Gateway, gateway_of
from stream_jobs.job_ids import MAX_JOB_ID_CHARS, id_problem, key_problem
from stream_jobs.job_types import get_job_type
from stream_jobs.lookup import DEFAULT_MAX_RECORDS_PER_TOPIC
from stream_jobs.redaction import shown_payload
from stream_jobs.tenants import MAX_TENANT_BYTES, tenant_problem
from stream_jobs.tools.cancel import cancel_job
from stream_jobs.tools.job_status import locate
from stream_jobs.tools.stats import collect
from stream_jobs.workflows.progress import read_progress

MAX_DELAY_S = 366 * 86_400.0  # a year and a day: longer is a mistake, not a schedule
TypeName = Annotated[str, Path(alias="type", description="A declared job type, e.g. email.send.",
                               max_length=249)]


class Problem(BaseModel):
    """An error: one sentence saying what went wrong and what to do."""

    detail: str


def _refusing(problem_of: Callable[[str], str | None]) -> AfterValidator:
    """A field's check: the client's own sentence (`problem_of`) as the 422's message."""

    def check(value: str | None) -> str | None:
        problem = None if value is None else problem_of(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


class JobIn(BaseModel):
    """One job. `payload` is the handler's input; the rest mean what `enqueue`'s
    arguments mean."""

    model_config = ConfigDict(extra="forbid")

    payload: dict[str, Any]
    key: Annotated[str | None, _refusing(key_problem)] = Field(
        default=None, max_length=1024,
        description="Partition key (default: the job ID); same key, same partition, in "
        "order. No control characters.")
    job_id: Annotated[str | None, _refusing(id_problem)] = Field(
        default=None, min_length=1, max_length=MAX_JOB_ID_CHARS,
        description="Give one to make a retried request safe: ctx.once() dedups by it. "
        "No control characters and no '/'.")
    priority: str = Field("default", max_length=16, description="A lane the type declares.")
    delay_s: float | None = Field(default=None, ge=0, le=MAX_DELAY_S, allow_inf_nan=False)
    expires_in_s: float | None = Field(default=None, gt=0, le=MAX_DELAY_S, allow_inf_nan=False)
    tenant: Annotated[str | None, _refusing(tenant_problem)] = Field(
        default=None, description=f"The customer the job is for (ctx.tenant; fair dispatch "
        f"and per-tenant limits): 1 to {MAX_TENANT_BYTES} bytes of UTF-8, no control "
        "characters. Leave it out for a job of no tenant.")


class BatchIn(BaseModel):
    """Several jobs of one type, written pipelined; all are checked before any is sent."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[JobIn] = Field(min_length=1)


class Enqueued(BaseModel):
    job_type: str
    job_ids: list[str] = Field(description="In request order; each acknowledged by Kafka.")


class TypeOut(BaseModel):
    job_type: str
    lanes: list[str]
    retry_tiers: list[str]
    max_attempts: int
    partitions: int
    rate_limit_per_s: float | None
    expires_in_s: float | None
    max_payload_bytes: int


class DlqOut(BaseModel):
    job_type: str
    topic: str
    letters: int = Field(description="Letters the DLQ holds.")
    jobs: int = Field(description="Dead-lettered jobs: distinct job IDs among the letters.")
    repeats: int = Field(description="Letters beyond each job's first (letters - jobs).")
    reasons: dict[str, int] = Field(description="Letters per reason, over the whole DLQ.")
    job_reasons: dict[str, int] = Field(description="Jobs per reason of their newest letter.")
    matching: int = Field(description="Letters that match reason and since.")
    matching_jobs: int = Field(description="Jobs with a letter that matches.")
    rows: list[LetterRow] = Field(description="The most recent matching jobs, oldest first: "
                                  "each job's newest matching letter and its letter count.")
    pending_drain: int = Field(description="Letters after the drain position (`all`).")


class RequeueIn(BaseModel):
    """Exactly one of `ids`, `reason` or `all`."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] | None = Field(default=None, min_length=1, max_length=1000)
    reason: str | None = Field(default=None, min_length=1, max_length=64)
    all: bool = False
    reset_attempts: bool = False
    force: bool = False
    dry_run: bool = False

    @model_validator(mode="after")
    def _one_selection(self) -> RequeueIn:
        chosen = sum([self.ids is not None, self.reason is not None, self.all])
        if chosen != 1:
            raise ValueError("give exactly one of ids, reason or all")
        return self

    def selection(self) -> Selection:
        if self.ids is not None:
            return SelectIds(frozenset(self.ids))
        if self.reason is not None:
            return SelectReason(self.reason)
        return SelectAll()


class RequeueOut(BaseModel):
    job_type: str
    mode: str
    dry_run: bool
    selected: int
    requeued: int = Field(description="Records acknowledged in their lanes.")
    drained: int = Field(description="Letters the drain committed past (`all` only).")
    repeats_skipped: int = Field(description="Older letters of jobs with a newer one: only "
                                 "a job's newest letter is sent.")
    left: dict[str, int] = Field(description="Letters left in the DLQ, by why.")
    lanes: dict[str, int] = Field(description="Requeues (planned, with dry_run) by lane.")


class JobOut(BaseModel):
    job_id: str
    status: str = Field(description="done, dead_lettered, running (a live worker's report "
                        "lists it in a handler: location.running_on says where), retrying, "
                        "scheduled, pending, finished, cancelled, superseded or not_seen.")
    summary: str
    job_type: str | None
    attempt: int | None
    complete: bool
    location: dict[str, Any] = Field(description="Everything the lookup found.")
    result: dict[str, Any] | None = Field(
        default=None, description="Its row of kept results (docs/results.md): state, "
        "result, error, attempt, finished_at, expires_at; null when none is kept.")
    payload: str | None = Field(
        default=None, description="Its payload as its latest record carries it, indented "
        "JSON text with the fields its type's `redact` names shown as •••; null when no "
        "record of it was read (a done job's are read with `records=true`).")
    tenant: str | None = Field(default=None, description="The customer the job is for, as "
                               "its latest record read names it; null for none.")


class BatchOut(BaseModel):
    """A batch or chain (docs/workflows.md): what `stream-jobs batch ID --json` prints."""

    id: str
    kind: str = Field(description="batch or chain.")
    state: str = Field(description="running, succeeded, completed (a batch with failed "
                       "members) or failed (a chain stopped at a step).")
    summary: str
    total: int
    succeeded: int
    failed: int
    pending: int
    created_at: str
    finished_at: str | None
    failed_step: int | None
    failure: str | None
    parent_job_id: str | None
    callbacks: list[dict[str, Any]]


class CancelIn(BaseModel):
    """Why: kept with the cancel, and shown by a lookup of the job."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=500)


class CancelOut(BaseModel):
    job_id: str
    job_type: str | None
    answer: str = Field(description="cancelled, already_cancelled or already_finished.")
    changed: bool = Field(description="True when this request cancelled the job.")
    summary: str


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    described = {
        401: "No bearer token, or not the gateway's.",
        404: "Unknown job type (or letter, job, batch or chain).",
        409: "The cancel waited for a run inside ctx.once() that did not stop; ask again.",
        413: "A payload or the request is over its limit.",
        503: "Kafka did not answer; try again after Retry-After seconds.",
    }
    return {code: {"model": Problem, "description": described[code]} for code in codes}


class StrictJsonRequest(Request):
    """Bodies parsed by orjson: strict JSON, so NaN, Infinity and lone surrogates are
    refused (422) instead of becoming `null` in a payload. Faster than `json` too."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict


class AnyTypeJsonRoute(StrictJsonRoute):
    """Reads the body as JSON whatever its Content-Type says. `curl -d` sends
    application/x-www-form-urlencoded, so a cancel written as most people write curl
    would be a 422.

    Only for routes whose auth is the bearer token, a header and never a cookie: a page
    of another site can make a browser send a form-encoded or text/plain body without a
    CORS preflight, but not with `Authorization`, which needs a preflight that the
    gateway never grants (it sends no CORS headers). (With `serve --no-auth` every route
    is open to whoever reaches it; a cancel needs no body at all.)"""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def as_json(request: Request) -> Response:
            headers = [(name, value) for name, value in request.scope["headers"]
                       if name != b"content-type"]
            scope = {**request.scope, "headers": [*headers,
                                                  (b"content-type", b"application/json")]}
            return await handler(Request(scope, request.receive))

        return as_json


router = APIRouter(route_class=StrictJsonRoute)
GatewayDep = Annotated[Gateway, Depends(gateway_of)]


@router.post("/jobs/{type}", status_code=202, response_model=Enqueued, tags=["jobs"],
             dependencies=[Authorized], responses=_errors(401, 404, 413, 503))
async def enqueue(job_type: TypeName, gateway: GatewayDep,
                  body: Annotated[JobIn | BatchIn, Body()]) -> Enqueued:
    """Enqueue one job (`{"payload": {...}}`) or a batch (`{"jobs": [...]}`); answers once
    Kafka acknowledged every job."""
    policy = get_job_type(gateway.types, job_type)
    items = body.jobs if isinstance(body, BatchIn) else [body]
    if len(items) > gateway.settings.gateway_max_batch:
        raise PayloadTooLarge(f"A batch holds at most {gateway.settings.gateway_max_batch} jobs "
                              f"(STREAM_JOBS_GATEWAY_MAX_BATCH); this one has {len(items)}: "
                              "split it.")
    jobs = [Job(policy.job_type, item.payload, key=item.key, job_id=item.job_id,
                priority=item.priority, delay=item.delay_s, expires_in=item.expires_in_s,
                tenant=item.tenant)
            for item in items]
    client = await gateway.enqueuer.client()
    try:
        async with asyncio.timeout(gateway.settings.gateway_enqueue_timeout_s):
            # Checks every job (422/413) before it sends any.
            ids = await client.enqueue_many(jobs)
    except TimeoutError as exc:
        raise PublishError(f"Kafka did not acknowledge the jobs within "
                           f"{gateway.settings.gateway_enqueue_timeout_s:g} s; they may or may "
                           "not be written: send them again with job_id set so ctx.once() "
                           "dedups them.") from exc
    gateway.enqueued.labels(policy.job_type).inc(len(ids))
    return Enqueued(job_type=policy.job_type, job_ids=ids)


@router.get("/jobs/{job_id}", response_model=JobOut, tags=["jobs"], dependencies=[Authorized],
            responses=_errors(401, 404, 503))
async def job(gateway: GatewayDep,
              job_id: Annotated[str, Path(min_length=1, max_length=64)],
              job_type: Annotated[str | None, Query(alias="type", max_length=249)] = None,
              max_records: Annotated[int, Query(ge=1, le=1_000_000)]
              = DEFAULT_MAX_RECORDS_PER_TOPIC,
              records: Annotated[bool, Query(description="Read a done job's records too "
                                             "(its payload, its trace ID): a scan of its "
                                             "type's topics instead of one row.")] = False
              ) -> JobOut:
    """What happened to a job: done, dead-lettered, running, retrying, scheduled, pending,
    finished, cancelled, superseded, not seen."""
    found = await locate(gateway.settings, gateway.types, job_id, job_type=job_type,
                         max_records_per_topic=max_records, records_of_done=records)
    return JobOut(job_id=found.job_id, status=found.status, summary=found.summary(),
                  job_type=found.job_type, attempt=found.attempt, complete=found.complete,
                  location=found.to_dict(),
                  result=None if found.result is None else found.result.to_dict(),
                  tenant=found.tenant,
                  payload=shown_payload(found.payload, _redacted(gateway, found.job_type)))


def _redacted(gateway: Gateway, job_type: str | None) -> tuple[str, ...]:
    policy = gateway.types.get(job_type) if job_type else None
    return policy.redact if policy is not None else ()


@router.get("/batches/{workflow_id}", response_model=BatchOut, tags=["jobs"],
            dependencies=[Authorized], responses=_errors(401, 404, 503))
async def batch(gateway: GatewayDep,
                workflow_id: Annotated[str, Path(min_length=1, max_length=64)]) -> BatchOut:
    """Where a batch or chain stands: members succeeded, failed and pending, callbacks
    written; a chain's current step, or the step that stopped it."""
    found = await read_progress(gateway.settings, workflow_id)
    return BatchOut(**found.to_dict())


async def cancel(gateway: GatewayDep,
                 job_id: Annotated[str, Path(min_length=1, max_length=64)],
                 job_type: Annotated[str | None, Query(alias="type", max_length=249)] = None,
                 body: Annotated[CancelIn | None, Body()] = None) -> CancelOut:
    """Cancel a job that has not finished: it never starts, and a run in progress is
    interrupted. A finished job is left as it is (`changed` is false); an unknown ID is
    404. `type` narrows the search for the job to one type's topics. The body is read as
    JSON whatever its Content-Type (`curl -d` sends a form's)."""
    if job_type is not None:
        get_job_type(gateway.types, job_type)
    answer = await cancel_job(gateway.settings, gateway.types, job_id, job_type=job_type,
                              reason=(body or CancelIn()).reason)
    return CancelOut(job_id=answer.job_id, job_type=answer.job_type, answer=answer.answer,
                     changed=answer.changed, summary=answer.summary())


# A JSON body with any Content-Type: `curl ... -d '{"reason": "..."}'` works as written.
router.add_api_route("/jobs/{job_id}/cancel", cancel, methods=["POST"],
                     response_model=CancelOut, tags=["jobs"], dependencies=[Authorized],
                     responses=_errors(401, 404, 409, 503),
                     route_class_override=AnyTypeJsonRoute)


@router.get("/types", response_model=list[TypeOut], tags=["types"])
async def types(gateway: GatewayDep) -> list[TypeOut]:
    """The declared job types (topics/*.toml) and their policies."""
    return [TypeOut(job_type=p.job_type, lanes=list(p.priorities),
                    retry_tiers=list(p.retry_tiers), max_attempts=p.max_attempts,
                    partitions=p.partitions, rate_limit_per_s=p.rate_limit_per_s,
                    expires_in_s=p.expires_in_s,
                    max_payload_bytes=p.payload_limit(gateway.settings))
            for p in sorted(gateway.types.values(), key=lambda p: p.job_type)]


@router.get("/types/{type}/stats", response_model=dict[str, Any], tags=["types"],
            responses=_errors(404, 503))
async def type_stats(job_type: TypeName, gateway: GatewayDep) -> dict[str, Any]:
    """Lag, oldest age, tier and DLQ depths, rates and workers, as `stats --json` has them."""
    get_job_type(gateway.types, job_type)
    snapshot = await collect(gateway.settings, gateway.types, job_type=job_type)
    return snapshot.types[0].to_dict(per_partition=False)


@router.get("/dlq/{type}", response_model=DlqOut, tags=["dlq"], dependencies=[Authorized],
            responses=_errors(401, 404, 503))
async def dlq(job_type: TypeName, gateway: GatewayDep,
              reason: Annotated[str | None, Query(max_length=64)] = None,
              since: Annotated[str | None, Query(max_length=64, description="ISO time (UTC) "
                                                 "or a duration ago: 2h, 30m.")] = None,
              limit: Annotated[int, Query(ge=0, le=1000)] = 50) -> DlqOut:
    """The type's DLQ counted in jobs, letters and repeats, its reason histogram and its
    most recent jobs (one row per job: its newest letter)."""
    get_job_type(gateway.types, job_type)
    since_ms = None if since is None else parse_since(since, now_ms())
    listing = await list_letters(gateway.settings, job_type, reason=reason, since_ms=since_ms,
                                 limit=limit)
    return DlqOut(job_type=listing.job_type, topic=listing.topic, letters=listing.letters,
                  jobs=listing.jobs, repeats=listing.repeats, reasons=listing.reasons,
                  job_reasons=listing.job_reasons, matching=listing.matching,
                  matching_jobs=listing.matching_jobs, rows=list(listing.rows),
                  pending_drain=listing.pending_drain)


@router.post("/dlq/{type}/requeue", response_model=RequeueOut, tags=["dlq"],
             dependencies=[Authorized], responses=_errors(401, 404, 503))
async def requeue_letters(job_type: TypeName, gateway: GatewayDep,
                          body: RequeueIn) -> RequeueOut:
    """Put dead letters back in their lanes (by ID, by reason, or a drain of all), with
    the loop guard and expiry rules of `stream-jobs dlq requeue`."""
    get_job_type(gateway.types, job_type)
    return await run_requeue(gateway, job_type, body)


async def run_requeue(gateway: Gateway, job_type: str, body: RequeueIn) -> RequeueOut:
    result = await requeue(gateway.settings, job_type, select=body.selection(),
                           reset_attempts=body.reset_attempts, force=body.force,
                           dry_run=body.dry_run)
    plan = result.plan
    return RequeueOut(job_type=job_type, mode=plan.mode, dry_run=result.dry_run,
                      selected=plan.selected, requeued=result.requeued, drained=result.drained,
                      repeats_skipped=plan.superseded,
                      left={str(v): n for v, n in plan.verdicts.items() if n and
                            str(v) != "requeue"},
                      lanes=dict(plan.lanes))


@router.get("/healthz", tags=["gateway"])
async def healthz(gateway: GatewayDep) -> dict[str, Any]:
    """Whether the gateway's client is connected and stats are being sampled."""
    sampler = gateway.sampler
    return {"types": len(gateway.types),
            "stats_sampled_at_ms": None if sampler.latest is None else sampler.latest.at_ms,
            "stats_problem": sampler.problem}



__all__ = ["router"]
