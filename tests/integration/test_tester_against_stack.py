"""JobTester checked against the real thing: one scenario (successes, a retry, a job that
runs out of attempts, a permanent error, an expiry, bad records) run by a real worker on
the real stack and by the in-memory harness gives the same outcomes, the same dead
letters (reason, attempt, error) and the same effects, job by job. A second one (a chain,
a batch with retries and a dead letter, cancels, a debounced burst, a unique key) gives
the same outcomes, results, callbacks and workflow counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
from pydantic import BaseModel

from stream_jobs import App, JobContext, PermanentError
from stream_jobs.client import Job, JobClient
from stream_jobs.dlq.letters import read_letter
from stream_jobs.errors import StreamJobsError
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.naming import dlq_topic, lane_topic
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from stream_jobs.testing import JobTester
from stream_jobs.workflows.members import step_job_id

from .conftest import Declare
from .topic_reader import read_topic

JOB_TYPE = "cmp.job"
TABLE = "CREATE TABLE cmp_done (job_id text PRIMARY KEY, kind text NOT NULL)"


class Step(BaseModel):
    kind: str


def scenario_app(settings: Settings) -> App:
    app = App(settings)

    @app.job(JOB_TYPE)
    async def step(job: Step, ctx: JobContext) -> None:
        if job.kind == "refused":
            raise PermanentError("refused for good")
        if job.kind == "broken" or (job.kind == "flaky" and ctx.attempt == 1):
            raise RuntimeError(f"{job.kind} on attempt {ctx.attempt}")
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO cmp_done VALUES ($1, $2)", ctx.job_id, job.kind)

    return app


@dataclass
class Seen:
    outcomes: Counter[str]
    letters: dict[str, tuple[str, int | None, str | None, str | None]]
    effects: set[str]


Enqueue = Callable[..., Awaitable[str]]
SendRaw = Callable[[bytes, bytes, list[tuple[str, bytes]]], Awaitable[None]]


async def feed(enqueue: Enqueue, send_raw: SendRaw) -> None:
    """The scenario's jobs, with job IDs of their own so both runs can be compared."""
    for n in range(3):
        await enqueue(JOB_TYPE, {"kind": "ok"}, job_id=f"ok-{n}")
    await enqueue(JOB_TYPE, {"kind": "flaky"}, job_id="flaky")
    await enqueue(JOB_TYPE, {"kind": "broken"}, job_id="broken")
    await enqueue(JOB_TYPE, {"kind": "refused"}, job_id="refused")
    await enqueue(JOB_TYPE, {"kind": "ok"}, job_id="late", delay=1, expires_in=0.5)
    await enqueue(JOB_TYPE, {"kind": "ok"}, job_id="ok-0")  # a duplicate of ok-0
    bad_json = JobRecord("bad-json", JOB_TYPE, b"{nope", b"bad-json")
    await send_raw(b"bad-json", bad_json.payload, bad_json.headers())
    misfit = JobRecord("misfit", JOB_TYPE, b'{"kind": 7}', b"misfit")
    await send_raw(b"misfit", misfit.payload, misfit.headers())
    await send_raw(b"headless", b'{"kind": "ok"}', [])


def letters_of(records: list[object], policy: JobTypePolicy, settings: Settings
               ) -> dict[str, tuple[str, int | None, str | None, str | None]]:
    found = {}
    for record in records:
        letter = read_letter(record, JOB_TYPE, policy.payload_limit(settings))  # type: ignore[arg-type]
        failure = letter.failure
        # By key: a record without headers gets its job ID from the worker that met it.
        name = record.key.decode()  # type: ignore[attr-defined]
        found[name] = (letter.reason, letter.attempt,
                       failure.error_class if failure else None,
                       failure.message if failure else None)
    return found


async def on_the_stack(settings: Settings, policy: JobTypePolicy) -> Seen:
    app = scenario_app(settings)
    lane = lane_topic(settings.topic_prefix, JOB_TYPE)
    async with app.client() as client, JobProducer(settings) as producer:

        async def send_raw(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
            await producer.send_raw(lane, key, value, headers)

        await feed(client.enqueue, send_raw)
    worker = app.worker(JOB_TYPE)
    await worker.run(until_idle=True)
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        effects = {row["job_id"] for row in await conn.fetch("SELECT job_id FROM cmp_done")}
    finally:
        await conn.close()
    letters = letters_of(await read_topic(settings, dlq_topic(settings.topic_prefix, JOB_TYPE)),
                         policy, settings)
    return Seen(Counter({str(k): v for k, v in worker.outcomes.items()}), letters, effects)


async def in_memory(settings: Settings, policy: JobTypePolicy) -> Seen:
    async with JobTester(scenario_app(settings), types={JOB_TYPE: policy}) as t:

        async def send_raw(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
            t.send_raw(JOB_TYPE, value, key=key, headers=headers)

        await feed(t.enqueue, send_raw)
        await t.run_until_idle()
        effects = {job_id for job_id, statements in
                   ((job_id, t.effects_of(job_id)) for job_id in t.done) if statements}
        letters = letters_of(t.broker.records(dlq_topic(settings.topic_prefix, JOB_TYPE)),
                             policy, settings)
        return Seen(t.outcomes, letters, effects)


async def test_the_harness_and_a_real_worker_see_the_same_outcomes(
        declare: Declare, settings: Settings, schema: str) -> None:
    policy = await declare(JOB_TYPE, partitions=2, retry_tiers=["1s"], max_attempts=3)
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": schema})
    try:
        await conn.execute(TABLE)
    finally:
        await conn.close()
    from stream_jobs.postgres.migrate import prepare_schema

    await prepare_schema(settings)

    real = await on_the_stack(settings, policy)
    harness = await in_memory(settings, policy)

    assert real.outcomes == {"succeeded": 4, "retried": 3, "dead_lettered": 5,
                             "expired": 1, "duplicate": 1}
    assert harness.outcomes == real.outcomes
    assert harness.letters == real.letters
    assert set(real.letters) == {"broken", "refused", "bad-json", "misfit", "headless"}
    assert real.letters["broken"][:2] == ("max-attempts", 3)
    assert harness.effects == real.effects == {"ok-0", "ok-1", "ok-2", "flaky"}


# -- cancels, debounce, unique keys, results, a chain and a batch -------------------------------

STEP, REPORT = "cmp.step", "cmp.report"


def workflow_app(settings: Settings, ran: list[tuple[str, object]]) -> App:
    app = App(settings)

    @app.job(STEP, keep_result="1h")
    async def step(job: dict[str, object], ctx: JobContext) -> dict[str, object]:
        ran.append((ctx.job_id, ctx.parent_result))
        if job.get("fail") == "always" or (job.get("fail") == "once" and ctx.attempt == 1):
            raise RuntimeError(f"failed on attempt {ctx.attempt}")
        async with ctx.once():
            parent = ctx.parent_result if isinstance(ctx.parent_result, dict) else {}
            return {"total": int(parent.get("total", 0)) + int(job.get("n", 0))}  # type: ignore[call-overload]

    @app.job(REPORT)
    async def report(job: dict[str, object], ctx: JobContext) -> None:
        ran.append((f"report:{job['name']}", job.get("batch")))

    return app


async def feed_workflows(client: JobClient) -> dict[str, str]:
    """The scenario's jobs (fixed IDs, so both runs compare); the IDs that unique and
    debounced enqueues answered."""
    await client.chain(Job(STEP, {"n": 1}), Job(STEP, {"n": 10}), Job(STEP, {"n": 100}),
                       chain_id="chain-ok")
    await client.chain(Job(STEP, {"n": 1}), Job(STEP, {"fail": "always"}), Job(STEP, {"n": 3}),
                       chain_id="chain-stops")
    await client.batch([Job(STEP, {"n": 1}, job_id="m-ok"),
                        Job(STEP, {"n": 2, "fail": "once"}, job_id="m-flaky"),
                        Job(STEP, {"fail": "always"}, job_id="m-dead")],
                       on_success=Job(REPORT, {"name": "success"}),
                       on_complete=Job(REPORT, {"name": "complete"}), batch_id="batch")
    await client.enqueue(STEP, {"n": 5}, job_id="held", delay=1)
    await client.cancel("held", reason="not needed")
    await client.cancel("queued-then-cancelled")
    await client.enqueue(STEP, {"n": 6}, job_id="queued-then-cancelled")
    answered = {}
    for n in range(3):
        found = await client.enqueue(STEP, {"n": n}, job_id=f"burst-{n}", key="burst",
                                     debounce="1s")
        answered[f"burst-{n}"] = str(found)
    for n in range(2):
        found = await client.enqueue(STEP, {"n": 7}, job_id=f"unique-{n}", unique_key="u")
        answered[f"unique-{n}"] = str(found)
    return answered


RESULT_IDS = ["chain-ok", "chain-stops", "m-ok", "m-flaky", "m-dead", "held",
              "queued-then-cancelled", "burst-0", "burst-2", "unique-0"]


async def results_of(client: JobClient) -> dict[str, object]:
    found: dict[str, object] = {}
    for name in RESULT_IDS:
        job_id = (step_job_id(name, 2) if name.startswith("chain") else name)
        try:
            found[name] = await client.result(job_id, timeout=0)
        except StreamJobsError as exc:
            found[name] = type(exc).__name__
    return found


@dataclass
class Flows:
    outcomes: Counter[str]
    ran: Counter[str]
    reports: list[tuple[str, object]]
    answered: dict[str, str]
    results: dict[str, object]
    progress: dict[str, tuple[str, int, int]]


async def summary(client: JobClient, ran: list[tuple[str, object]], outcomes: Counter[str],
                  answered: dict[str, str]) -> Flows:
    progress = {}
    for workflow_id in ("chain-ok", "chain-stops", "batch"):
        p = await client.progress(workflow_id)
        progress[workflow_id] = (p.state, p.succeeded, p.failed)
    return Flows(outcomes, Counter(name for name, _ in ran),
                 sorted((name, batch) for name, batch in ran if name.startswith("report")),
                 answered, await results_of(client), progress)


async def flows_on_the_stack(settings: Settings) -> Flows:
    ran: list[tuple[str, object]] = []
    app = workflow_app(settings, ran)
    outcomes: Counter[str] = Counter()
    async with app.client() as client, OutboxRelay(settings) as relay:
        answered = await feed_workflows(client)
        while await relay.drain() or not outcomes:  # until a round writes nothing new
            for job_type in (STEP, REPORT):
                worker = app.worker(job_type)
                await worker.run(until_idle=True)
                outcomes.update({str(k): v for k, v in worker.outcomes.items()})
        return await summary(client, ran, outcomes, answered)


async def flows_in_memory(settings: Settings, types: dict[str, JobTypePolicy]) -> Flows:
    ran: list[tuple[str, object]] = []
    app = workflow_app(settings, ran)
    async with JobTester(app, types=types) as t, app.client() as client:
        answered = await feed_workflows(client)
        await t.run_until_idle()
        return await summary(client, ran, t.outcomes, answered)


async def test_cancels_keys_results_and_workflows_match_the_real_stack(
        declare: Declare, settings: Settings) -> None:
    types = {job_type: await declare(job_type, partitions=2, retry_tiers=["1s"], max_attempts=2)
             for job_type in (STEP, REPORT)}
    from stream_jobs.postgres.migrate import prepare_schema

    await prepare_schema(settings)
    real = await flows_on_the_stack(settings)
    harness = await flows_in_memory(settings, types)

    assert real.outcomes == {"succeeded": 9, "retried": 3, "dead_lettered": 2,
                             "cancelled": 2, "superseded": 2}
    assert real.reports == [("report:complete", {"id": "batch", "total": 3, "succeeded": 2,
                                                 "failed": 1})]
    assert real.results["chain-ok"] == {"total": 111}
    assert real.answered["unique-1"] == "unique-0"
    assert harness == real
