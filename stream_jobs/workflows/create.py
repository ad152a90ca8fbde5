"""Making a batch or a chain: its row, the jobs it writes later, its first jobs. One
transaction.

`client.batch(...)` / `client.chain(...)` (and `ctx.batch` / `ctx.chain` inside a
handler's exactly-once block) turn their jobs into a `Plan`: statements that insert the
workflow's row, its templates (a batch's callbacks, a chain's later steps) and its first
jobs into the outbox (a batch's members, a chain's first step). Run in one transaction
(the client's own, the caller's, or the parent job's), so a workflow exists with all its
members or not at all, and its counters exist before any member can finish. The relay
then moves the members to Kafka.

Every job is checked before anything is written, as `enqueue` checks it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
import orjson

from stream_jobs.dedup.deferred import DeferredWrites, Statement
from stream_jobs.errors import ConfigError, DatabaseUnavailable, OutboxWriteError
from stream_jobs.outbox.rows import insert_args, insert_sql
from stream_jobs.payloads import encode_payload
from stream_jobs.record import JobRecord
from stream_jobs.redaction import redact_text, redact_url
from stream_jobs.settings import Settings
from stream_jobs.workflows.members import (
    CALLBACK_SLOTS,
    JobTemplate,
    Membership,
    callback_job_id,
    check_steps,
    check_workflow_id,
    distinct_ids,
    step_job_id,
    template_of,
    with_summary,
)
from stream_jobs.workflows.sql import insert_templates_sql, insert_workflow_sql

Prepared = tuple[str, JobRecord]


class JobSpec(Protocol):
    """What a workflow reads of a `stream_jobs.client.Job` (a frozen dataclass)."""

    @property
    def job_type(self) -> str: ...

    @property
    def payload(self) -> Any: ...

    @property
    def job_id(self) -> str | None: ...


Prepare = Callable[[Any], Prepared]  # `JobClient.prepare`: a Job -> (topic, record)


@dataclass(frozen=True)
class Plan:
    """The statements that make one workflow, and the job IDs of its members or steps."""

    workflow_id: str
    statements: list[Statement]
    job_ids: list[str]


def batch_plan(schema: str, batch_id: str, jobs: Sequence[JobSpec], prepare: Prepare, *,
               on_success: JobSpec | None = None, on_complete: JobSpec | None = None,
               parent_job_id: str | None = None) -> Plan:
    """A batch of `jobs` whose callbacks run once when every member succeeded
    (`on_success`) or finished, dead letters included (`on_complete`). An empty batch is
    complete at once: its callbacks are written with it."""
    check_workflow_id(batch_id)
    header = Membership("batch", batch_id).header()
    members = [(topic, record.with_(workflow=header))
               for topic, record in (prepare(job) for job in jobs)]
    distinct_ids([record for _, record in members])
    total = len(members)
    callbacks: list[tuple[str, Prepared]] = []
    for slot, job in zip(CALLBACK_SLOTS, (on_success, on_complete), strict=True):
        if job is not None:
            callbacks.append((slot, _callback(prepare, job, batch_id, slot, total)))
    statements: list[Statement] = [
        (insert_workflow_sql(schema), (batch_id, "batch", total, parent_job_id, total == 0))]
    if total == 0:  # complete already: the callbacks go now, with a summary of nothing
        statements += _outbox([prepared for _, prepared in callbacks], schema)
    else:
        templates = [template_of(slot, topic, record) for slot, (topic, record) in callbacks]
        statements += _templates(schema, batch_id, templates)
        statements += _outbox(members, schema)
    return Plan(batch_id, statements, [record.job_id for _, record in members])


def chain_plan(schema: str, chain_id: str, jobs: Sequence[JobSpec], prepare: Prepare, *,
               parent_job_id: str | None = None) -> Plan:
    """A chain of `jobs`: the first is written now, each next one when the one before it
    succeeded (with its result for `ctx.parent_result`)."""
    check_workflow_id(chain_id)
    check_steps(len(jobs))
    steps: list[Prepared] = []
    for i, job in enumerate(jobs):
        if job.job_id is not None:
            raise ConfigError(f"Step {i} of the chain gives a job_id: a chain's steps get "
                              "theirs from the chain (stream_jobs.workflows.step_job_id).")
        topic, record = prepare(dataclasses.replace(job, job_id=step_job_id(chain_id, i)))  # type: ignore[type-var]
        steps.append((topic, record.with_(workflow=Membership("chain", chain_id, i).header())))
    templates = [template_of(str(i), topic, record)
                 for i, (topic, record) in enumerate(steps) if i > 0]
    statements: list[Statement] = [
        (insert_workflow_sql(schema), (chain_id, "chain", len(steps), parent_job_id, False))]
    statements += _templates(schema, chain_id, templates)
    statements += _outbox(steps[:1], schema)
    return Plan(chain_id, statements, [record.job_id for _, record in steps])


def _callback(prepare: Prepare, job: JobSpec, batch_id: str, slot: str, total: int
              ) -> Prepared:
    if job.job_id is not None:
        raise ConfigError(f"The batch's {slot} job gives a job_id: a callback's ID comes "
                          "from the batch, so that it runs once.")
    value = with_summary(encode_payload(job.payload), batch_id, total, job.job_type)
    fixed = dataclasses.replace(job, job_id=callback_job_id(batch_id, slot),  # type: ignore[type-var]
                                payload=orjson.loads(value))
    return prepare(fixed)


def _templates(schema: str, workflow_id: str, templates: Sequence[JobTemplate]
               ) -> list[Statement]:
    if not templates:
        return []
    columns = ([t.slot for t in templates], [t.job_id for t in templates],
               [t.job_type for t in templates], [t.topic for t in templates],
               [t.key for t in templates], [t.value for t in templates],
               [t.headers_json for t in templates], [t.expires_in_ms for t in templates])
    return [(insert_templates_sql(schema), (workflow_id, *columns))]


def _outbox(records: Sequence[Prepared], schema: str) -> list[Statement]:
    if not records:
        return []
    return [(insert_sql(schema, "asyncpg"), insert_args(records, schema))]


async def write_plan(conn: Any, plan: Plan) -> None:
    """Run `plan` on an asyncpg connection inside the caller's transaction."""
    if not conn.is_in_transaction():
        raise OutboxWriteError("A batch or chain is written in a transaction: use "
                               "`async with conn.transaction():` around it.")
    for sql, args in plan.statements:
        try:
            await conn.execute(sql, *args)
        except asyncpg.UniqueViolationError as exc:
            raise ConfigError(f"A batch or chain with the ID {plan.workflow_id!r} exists "
                              "already: give a new ID, or none.") from exc
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError) as exc:
            raise ConfigError("There are no workflow tables in the schema: run `stream-jobs "
                              "db migrate`.") from exc
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise OutboxWriteError(f"The batch or chain {plan.workflow_id} could not be "
                                   f"written ({exc}); roll the transaction back.") from exc


async def write_plan_alone(settings: Settings, plan: Plan) -> None:
    """Run `plan` in a transaction of its own (the caller gave no connection)."""
    try:
        conn = await asyncpg.connect(settings.database_url, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise DatabaseUnavailable(redact_text(f"Postgres did not answer at "
                                              f"{redact_url(settings.database_url)}: {exc}",
                                              settings)) from exc
    try:
        async with conn.transaction():
            await write_plan(conn, plan)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise DatabaseUnavailable(redact_text(f"The batch or chain {plan.workflow_id} was not "
                                              f"committed: {exc}", settings)) from exc
    finally:
        await conn.close()


async def write_plan_in(settings: Settings, plan: Plan, conn: Any) -> str:
    """Run `plan` in the caller's transaction (`conn`, asyncpg) or one of its own; the
    workflow's ID."""
    if conn is not None:
        await write_plan(conn, plan)
    else:
        await write_plan_alone(settings, plan)
    return plan.workflow_id


async def record_plan(writes: DeferredWrites, plan: Plan) -> None:
    """Record `plan` into a deferred block: applied with the job's dedup row."""
    for sql, args in plan.statements:
        await writes.execute(sql, *args)


__all__ = ["JobSpec", "Plan", "batch_plan", "chain_plan", "record_plan", "write_plan",
           "write_plan_alone", "write_plan_in"]
