"""The statements of the finish transaction and of making batches and chains. Text only.

Each finish statement is one statement (CTEs), so it can be one more recorded statement
of a deferred batch (`executemany` runs it for many jobs in one round trip) as well as
run on a live connection. Its parts, in order:

1. the job's row in `stream_jobs_results`: inserted, or turned from a non-success state
   into `succeeded` (`xmax = 0` tells the two apart); a job already `succeeded` changes
   nothing. For a terminal state, inserted only when the job has no row yet and no
   dedup row (it never succeeded), else nothing;
2. if the job is a batch member or a chain step and part 1 changed a row: its workflow's
   counters, under the workflow row's lock, so concurrent members serialise there and
   exactly one of them sees the count reach the total;
3. the jobs that this change makes due, copied from `stream_jobs_workflow_jobs` into the
   outbox with their times stamped now (and, for a batch's callback, the counts put in
   its payload): `on_success` when `succeeded` reaches `total`; `on_complete` when the
   finished members (succeeded + failed) do; a chain's next step when a step succeeds;
4. NOTIFYs: the outbox relays (only if a row was written) and the result's waiters.

The statement runs in the transaction that holds the job's dedup row (success), so the
row, the effects, the result, the counters and the callback commit together or not at
all; a member counts once whatever the redeliveries.

Parameters: $1 job ID, $2 type, $3 attempt, $4 result JSON (success) or reason text
(terminal), $5 seconds to keep the row, $6 the results channel of the job's bucket (NULL:
nobody waits on this type), then for terminal statements $7 the state; then the workflow's
ID, the chain step, and the outbox channel.
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_jobs.cancels.rules import MARKER_ATTEMPT
from stream_jobs.dedup.deferred import ColumnStatement
from stream_jobs.outbox.rows import table as outbox_table
from stream_jobs.postgres.names import (
    MEMBER_ENDED,
    MEMBER_SUCCEEDED,
    RESULT_ENDED,
    RESULT_SUCCEEDED,
    WORKFLOW_INSERT,
    WORKFLOW_STEPS,
    named,
)
from stream_jobs.results.store import results_table


def _t(schema: str, name: str) -> str:
    return f'"{schema}".{name}'


def workflows_table(schema: str) -> str:
    return _t(schema, "stream_jobs_workflows")


def workflow_jobs_table(schema: str) -> str:
    return _t(schema, "stream_jobs_workflow_jobs")


def _upsert_succeeded(schema: str) -> str:
    return (
        f"r AS (INSERT INTO {results_table(schema)} AS x (job_id, job_type, state, result, "
        "error, attempt, finished_at, expires_at) VALUES ($1, $2, 'succeeded', "
        "CAST($4 AS text)::jsonb, NULL, $3, now(), now() + make_interval(secs => $5)) "
        "ON CONFLICT (job_id) DO UPDATE SET state = 'succeeded', result = EXCLUDED.result, "
        "error = NULL, attempt = EXCLUDED.attempt, finished_at = EXCLUDED.finished_at, "
        "expires_at = EXCLUDED.expires_at WHERE x.state <> 'succeeded' "
        "RETURNING (x.xmax = 0) AS fresh)")


def _insert_terminal(schema: str) -> str:
    # A dedup row of a run (not a cancel's marker, attempt 0) means the job succeeded: it
    # never gets a terminal row. A cancelled job's row says why, in the cancel's words.
    reason = (f"COALESCE((SELECT 'cancelled: ' || c.reason FROM "
              f"{_t(schema, 'stream_jobs_cancels')} c WHERE c.job_id = CAST($1 AS varchar) "
              "AND c.reason IS NOT NULL AND CAST($7 AS varchar) = 'cancelled'), "
              "CAST($4 AS text))")
    return (
        f"r AS (INSERT INTO {results_table(schema)} (job_id, job_type, state, result, error, "
        "attempt, finished_at, expires_at) SELECT CAST($1 AS varchar), CAST($2 AS varchar), "
        f"CAST($7 AS varchar), NULL, {reason}, CAST($3 AS int), now(), "
        "now() + make_interval(secs => $5) "
        f"WHERE NOT EXISTS (SELECT 1 FROM {_t(schema, 'stream_jobs_done')} "
        f"WHERE job_id = CAST($1 AS varchar) AND attempt <> {MARKER_ATTEMPT}) "
        "ON CONFLICT (job_id) DO NOTHING RETURNING true AS fresh)")


# $6 is the channel of the job's bucket (stream_jobs.results.store): equal notifications
# of one transaction fold into one.
_NOTIFY_WAITERS = "CASE WHEN CAST($6 AS text) IS NOT NULL THEN pg_notify($6, '') END"


def succeeded_sql(schema: str) -> str:
    """A job of a type that keeps results succeeded (no workflow): $1..$6."""
    return f"WITH {_upsert_succeeded(schema)} SELECT {_NOTIFY_WAITERS} FROM r"


def terminal_sql(schema: str) -> str:
    """A job of a type that keeps results ended without success (no workflow): $1..$7."""
    return f"WITH {_insert_terminal(schema)} SELECT {_NOTIFY_WAITERS} FROM r"


# The payload of a batch's callback gets the batch's counts; a chain's step is as it was.
_VALUE = ("CASE WHEN d.kind = 'batch' THEN convert_to((convert_from(d.value, 'UTF8')::jsonb "
          "|| jsonb_build_object('batch', jsonb_build_object('id', d.workflow_id, 'total', "
          "d.total, 'succeeded', d.succeeded, 'failed', d.failed)))::text, 'UTF8') "
          "ELSE d.value END")
_NOW_MS = "CAST(extract(epoch FROM clock_timestamp()) * 1000 AS bigint)"
_HEADERS = (f"d.headers || jsonb_build_array(jsonb_build_array('sj-enqueued-at', "
            f"CAST({_NOW_MS} AS text))) || CASE WHEN d.expires_in_ms IS NULL THEN "
            "'[]'::jsonb ELSE jsonb_build_array(jsonb_build_array('sj-expires-at', "
            f"CAST({_NOW_MS} + d.expires_in_ms AS text))) END")


def _due_and_sent(schema: str, condition: str, channel: str) -> str:
    return (
        f"d AS (SELECT j.*, w.kind, w.total, w.succeeded, w.failed FROM w JOIN "
        f"{workflow_jobs_table(schema)} j ON j.workflow_id = w.workflow_id WHERE {condition}), "
        f"sent AS (INSERT INTO {outbox_table(schema)} (topic, key, value, headers) "
        f"SELECT d.topic, d.key, {_VALUE}, {_HEADERS} FROM d ORDER BY d.slot RETURNING 1) "
        f"SELECT (SELECT pg_notify({channel}, '') FROM (SELECT 1 FROM sent LIMIT 1) s), "
        f"(SELECT {_NOTIFY_WAITERS} FROM r)")


def member_succeeded_sql(schema: str) -> str:
    """A batch member or chain step succeeded: $1..$6, $7 workflow, $8 step, $9 outbox
    channel."""
    undo_failed = "CASE WHEN r.fresh THEN 0 ELSE 1 END"
    update = (
        f"w AS (UPDATE {workflows_table(schema)} AS w SET succeeded = w.succeeded + 1, "
        f"failed = w.failed - {undo_failed}, "
        "failed_step = CASE WHEN w.kind = 'chain' THEN NULL ELSE w.failed_step END, "
        "failure = CASE WHEN w.kind = 'chain' THEN NULL ELSE w.failure END, "
        "finished_at = CASE WHEN w.kind = 'chain' THEN "
        "CASE WHEN w.succeeded + 1 >= w.total THEN now() END "
        f"WHEN w.finished_at IS NULL AND w.succeeded + 1 + w.failed - {undo_failed} "
        ">= w.total THEN now() ELSE w.finished_at END "
        "FROM r WHERE w.workflow_id = $7 "
        "RETURNING w.workflow_id, w.kind, w.total, w.succeeded, w.failed, r.fresh)")
    due = ("CASE WHEN w.kind = 'chain' THEN j.slot = CAST($8 + 1 AS text) "
           "ELSE (j.slot = 'on_success' AND w.succeeded = w.total) OR (j.slot = "
           "'on_complete' AND w.fresh AND w.succeeded + w.failed = w.total) END")
    return f"WITH {_upsert_succeeded(schema)}, {update}, {_due_and_sent(schema, due, '$9')}"


def member_ended_sql(schema: str) -> str:
    """A batch member or chain step ended without success (dead-lettered, expired,
    cancelled): $1..$7, $8 workflow, $9 step, $10 outbox channel. A chain stops at it."""
    update = (
        f"w AS (UPDATE {workflows_table(schema)} AS w SET failed = w.failed + 1, "
        "failed_step = CASE WHEN w.kind = 'chain' THEN CAST($9 AS int) "
        "ELSE w.failed_step END, "
        "failure = CASE WHEN w.kind = 'chain' THEN $4 ELSE w.failure END, "
        "finished_at = CASE WHEN w.finished_at IS NOT NULL THEN w.finished_at "
        "WHEN w.kind = 'chain' OR w.succeeded + w.failed + 1 >= w.total THEN now() END "
        "FROM r WHERE w.workflow_id = $8 "
        "RETURNING w.workflow_id, w.kind, w.total, w.succeeded, w.failed)")
    due = ("w.kind = 'batch' AND j.slot = 'on_complete' "
           "AND w.succeeded + w.failed = w.total")
    return f"WITH {_insert_terminal(schema)}, {update}, {_due_and_sent(schema, due, '$10')}"


# -- the same for a deferred batch of jobs at once (`ColumnStatement.many`) ------------------

# The k-th parameter of the one-job statement becomes an array of every job's k-th argument.
_UNNEST = ("u AS (SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], "
           "$5::float8[], $6::text[]{more}) AS u(job_id, job_type, attempt, result, keep_s, "
           "channel{names}))")


def _upsert_succeeded_many(schema: str) -> str:
    return (
        f"r AS (INSERT INTO {results_table(schema)} AS x (job_id, job_type, state, result, "
        "error, attempt, finished_at, expires_at) SELECT u.job_id, u.job_type, 'succeeded', "
        "u.result::jsonb, NULL, u.attempt, now(), now() + make_interval(secs => u.keep_s) "
        "FROM u ON CONFLICT (job_id) DO UPDATE SET state = 'succeeded', "
        "result = EXCLUDED.result, error = NULL, attempt = EXCLUDED.attempt, "
        "finished_at = EXCLUDED.finished_at, expires_at = EXCLUDED.expires_at "
        "WHERE x.state <> 'succeeded' RETURNING x.job_id, (x.xmax = 0) AS fresh)")


_NOTIFY_MANY = ("(SELECT count(pg_notify(c.channel, '')) FROM (SELECT DISTINCT u.channel "
                "FROM u JOIN r USING (job_id) WHERE u.channel IS NOT NULL) c)")


def succeeded_many_sql(schema: str) -> str:
    """`succeeded_sql` for many jobs: $1..$6 arrays."""
    return (f"WITH {_UNNEST.format(more='', names='')}, {_upsert_succeeded_many(schema)} "
            f"SELECT {_NOTIFY_MANY}")


def member_succeeded_many_sql(schema: str) -> str:
    """`member_succeeded_sql` for many jobs: $1..$9 arrays. Each workflow's row changes
    once for all of its members in the batch; a callback is due when this change made the
    count reach the total."""
    unnest = _UNNEST.format(more=", $7::text[], $8::int[]", names=", workflow_id, step")
    tally = ("g AS (SELECT u.workflow_id, count(*) AS n, count(*) FILTER (WHERE NOT r.fresh) "
             "AS converted, max(u.step) AS step FROM r JOIN u USING (job_id) "
             "GROUP BY u.workflow_id)")
    update = (
        f"w AS (UPDATE {workflows_table(schema)} AS w SET succeeded = w.succeeded + g.n, "
        "failed = w.failed - g.converted, "
        "failed_step = CASE WHEN w.kind = 'chain' THEN NULL ELSE w.failed_step END, "
        "failure = CASE WHEN w.kind = 'chain' THEN NULL ELSE w.failure END, "
        "finished_at = CASE WHEN w.kind = 'chain' THEN "
        "CASE WHEN w.succeeded + g.n >= w.total THEN now() END "
        "WHEN w.finished_at IS NULL AND w.succeeded + g.n + w.failed - g.converted "
        ">= w.total THEN now() ELSE w.finished_at END "
        "FROM g WHERE w.workflow_id = g.workflow_id RETURNING w.workflow_id, w.kind, "
        "w.total, w.succeeded, w.failed, g.n, g.converted, g.step)")
    due = ("CASE WHEN w.kind = 'chain' THEN j.slot = CAST(w.step + 1 AS text) "
           "ELSE (j.slot = 'on_success' AND w.succeeded = w.total) OR (j.slot = "
           "'on_complete' AND w.n > w.converted AND w.succeeded + w.failed = w.total) END")
    d = (f"d AS (SELECT j.*, w.kind, w.total, w.succeeded, w.failed FROM w JOIN "
         f"{workflow_jobs_table(schema)} j ON j.workflow_id = w.workflow_id WHERE {due})")
    sent = (f"sent AS (INSERT INTO {outbox_table(schema)} (topic, key, value, headers) "
            f"SELECT d.topic, d.key, {_VALUE}, {_HEADERS} FROM d ORDER BY d.workflow_id, "
            "d.slot RETURNING 1)")
    return (f"WITH {unnest}, {_upsert_succeeded_many(schema)}, {tally}, {update}, {d}, {sent} "
            "SELECT (SELECT pg_notify(($9::text[])[1], '') FROM (SELECT 1 FROM sent LIMIT 1) "
            f"s), {_NOTIFY_MANY}")


# -- making batches and chains -------------------------------------------------------------


def insert_workflow_sql(schema: str) -> str:
    """$1 ID, $2 kind, $3 total, $4 parent job ID (or NULL), $5 already finished."""
    return named(
        f"INSERT INTO {workflows_table(schema)} (workflow_id, kind, total, parent_job_id, "
        "finished_at) VALUES ($1, $2, $3, $4, CASE WHEN $5 THEN now() END)", WORKFLOW_INSERT)


def insert_templates_sql(schema: str) -> str:
    """$1 the workflow's ID, then one array per column of the templates."""
    return named(
        f"INSERT INTO {workflow_jobs_table(schema)} (workflow_id, slot, job_id, job_type, "
        "topic, key, value, headers, expires_in_ms) SELECT $1, u.slot, u.job_id, "
        "u.job_type, u.topic, u.key, u.value, u.headers::jsonb, u.expires_in_ms FROM "
        "unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[], "
        "$8::text[], $9::bigint[]) AS u(slot, job_id, job_type, topic, key, value, "
        "headers, expires_in_ms)", WORKFLOW_STEPS)


@dataclass(frozen=True)
class Statements:
    """The statements of one schema, made once per store (they are long to build)."""

    succeeded: ColumnStatement
    terminal: str
    member_succeeded: ColumnStatement
    member_ended: str

    @classmethod
    def of(cls, schema: str) -> Statements:
        return cls(ColumnStatement(succeeded_sql(schema), succeeded_many_sql(schema),
                                   RESULT_SUCCEEDED),
                   named(terminal_sql(schema), RESULT_ENDED),
                   ColumnStatement(member_succeeded_sql(schema),
                                   member_succeeded_many_sql(schema), MEMBER_SUCCEEDED),
                   named(member_ended_sql(schema), MEMBER_ENDED))


__all__ = ["Statements", "insert_templates_sql", "insert_workflow_sql", "workflow_jobs_table",
           "workflows_table"]
