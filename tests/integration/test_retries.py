"""Retries through delay tiers, dead letters, expiry, delays and bad input (real stack)."""

from __future__ import annotations

import asyncio
import time

import orjson
from aiokafka import AIOKafkaProducer

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.failures import parse_failure
from stream_jobs.naming import dlq_topic, lane_topic
from stream_jobs.record import decode_record, parse_origin
from stream_jobs.settings import Settings

from .conftest import Declare
from .topic_reader import read_topic


def _ms() -> int:
    return int(time.time() * 1000)


async def test_a_job_failing_twice_runs_three_times_through_its_tiers(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("flaky.job", partitions=1, retry_tiers=["1s", "2s"], max_attempts=4,
                  retention="1d")
    runs: dict[str, list[tuple[int, int]]] = {}

    @app.job("flaky.job", ordering="partition")
    async def flaky(job: dict[str, str], ctx: JobContext) -> None:
        runs.setdefault(job["name"], []).append((ctx.attempt, _ms()))
        if job["name"] == "flaky" and ctx.attempt < 3:
            raise RuntimeError(f"boom {ctx.attempt}")

    async with app.client() as client:
        await client.enqueue("flaky.job", {"name": "flaky"})
        for i in range(5):
            await client.enqueue("flaky.job", {"name": f"behind-{i}"})

    worker = app.worker("flaky.job")
    await worker.run(until_idle=True)

    attempts = runs["flaky"]
    assert [a for a, _ in attempts] == [1, 2, 3]
    gap_1 = attempts[1][1] - attempts[0][1]
    gap_2 = attempts[2][1] - attempts[1][1]
    # Each gap is at least its tier; jitter (<= 10%) and relay latency add a little.
    assert 1_000 <= gap_1 < 1_000 + 100 + 1_500, gap_1
    assert 2_000 <= gap_2 < 2_000 + 200 + 1_500, gap_2
    # The jobs behind the failing one ran before its first retry: it did not block them.
    assert all(runs[f"behind-{i}"][0][1] < attempts[1][1] for i in range(5))
    assert worker.outcomes["retried"] == 2
    assert worker.outcomes["succeeded"] == 6


async def test_the_real_5s_tier_holds_a_retry_for_5_seconds(
        app: App, declare: Declare) -> None:
    await declare("slow.retry", partitions=1, retry_tiers=["5s"], max_attempts=2)
    seen: list[int] = []

    @app.job("slow.retry")
    async def once_failing(job: dict[str, int], ctx: JobContext) -> None:
        seen.append(_ms())
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")

    async with app.client() as client:
        await client.enqueue("slow.retry", {"x": 1})
    await app.worker("slow.retry").run(until_idle=True)
    assert len(seen) == 2
    assert 5_000 <= seen[1] - seen[0] < 5_000 + 500 + 1_500


async def test_a_handler_past_its_timeout_is_cut_off_and_retried(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("slow.handler", partitions=1, retry_tiers=["1s"], max_attempts=2)
    started: list[tuple[str, int, float]] = []
    cut_off: list[str] = []
    ran_for: list[float] = []
    never = asyncio.Event()

    @app.job("slow.handler", timeout=0.3, concurrency=4)
    async def slow(job: dict[str, str], ctx: JobContext) -> None:
        started.append((job["name"], ctx.attempt, time.monotonic()))
        if job["name"] == "hangs" or (job["name"] == "hangs-once" and ctx.attempt == 1):
            began = time.monotonic()
            try:
                await never.wait()
            except asyncio.CancelledError:
                cut_off.append(job["name"])
                ran_for.append(time.monotonic() - began)
                raise

    async with app.client() as client:
        for name in ("hangs", "hangs-once", "quick"):
            await client.enqueue("slow.handler", {"name": name})
    worker = app.worker("slow.handler")
    await worker.run(until_idle=True)

    assert sorted(n for n, _, _ in started) == ["hangs", "hangs", "hangs-once",
                                                "hangs-once", "quick"]
    assert sorted(cut_off) == ["hangs", "hangs", "hangs-once"]
    assert worker.outcomes["succeeded"] == 2
    assert worker.outcomes["retried"] == 2
    assert worker.outcomes["dead_lettered"] == 1
    # Cut off at its timeout, not before (the watchdog ticks every 50 ms; the bound above
    # is loose because the test machine may be loaded).
    assert all(0.29 <= t < 5 for t in ran_for), ran_for
    letters = await read_topic(settings, dlq_topic(settings.topic_prefix, "slow.handler"))
    assert len(letters) == 1
    job = decode_record(key=letters[0].key, value=letters[0].value,
                        headers=letters[0].headers, expected_type="slow.handler",
                        max_payload_bytes=10**6)
    assert job.failure is not None
    assert job.failure.reason == "max-attempts"
    assert job.failure.error_class == "TimeoutError"
    assert "0.3 s" in job.failure.message


async def test_always_failing_job_is_dead_lettered_after_max_attempts(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("doomed.job", partitions=2, retry_tiers=["1s"], max_attempts=3)
    attempts: list[int] = []
    enqueued_at: dict[str, set[int]] = {}

    @app.job("doomed.job")
    async def doomed(job: dict[str, str], ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        enqueued_at.setdefault(ctx.job_id, set()).add(ctx.enqueued_at_ms)
        if job["kind"] == "permanent":
            raise PermanentError("this input can never work")
        raise ValueError("downstream says no")

    async with app.client() as client:
        always = await client.enqueue("doomed.job", {"kind": "always"})
        permanent = await client.enqueue("doomed.job", {"kind": "permanent"})
    worker = app.worker("doomed.job")
    await worker.run(until_idle=True)

    assert sorted(attempts) == [1, 1, 2, 3]
    letters = await read_topic(settings, dlq_topic(settings.topic_prefix, "doomed.job"))
    by_id = {}
    for letter in letters:
        job = decode_record(key=letter.key, value=letter.value, headers=letter.headers,
                            expected_type="doomed.job", max_payload_bytes=10**6)
        by_id[job.job_id] = job
    assert set(by_id) == {always, permanent}
    assert by_id[always].attempt == 3
    failure = by_id[always].failure
    assert failure is not None
    assert failure.reason == "max-attempts"
    assert failure.error_class.endswith("ValueError")
    assert "downstream says no" in failure.message
    assert "doomed" in failure.traceback
    # The origin is where the job was first enqueued, not where its last attempt ran (the
    # relay wrote attempts 2 and 3 to the lane again, at later offsets).
    lane = lane_topic(settings.topic_prefix, "doomed.job")
    runs = [(r, decode_record(key=r.key, value=r.value, headers=r.headers,
                              expected_type="doomed.job", max_payload_bytes=10**6))
            for r in await read_topic(settings, lane)]
    always_runs = sorted(((r, j) for r, j in runs if j.job_id == always),
                         key=lambda rj: rj[1].attempt)
    assert [j.attempt for _, j in always_runs] == [1, 2, 3]
    first, first_job = always_runs[0]
    assert parse_origin(by_id[always].origin or "") == (lane, first.partition, first.offset)
    assert (first.partition, first.offset) != (always_runs[-1][0].partition,
                                               always_runs[-1][0].offset)
    # enqueued_at is the first enqueue's time on every attempt and on the dead letter.
    assert enqueued_at[always] == {first_job.enqueued_at_ms}
    assert {j.enqueued_at_ms for _, j in always_runs} == {first_job.enqueued_at_ms}
    assert by_id[always].enqueued_at_ms == first_job.enqueued_at_ms
    assert abs(first.timestamp - first_job.enqueued_at_ms) < 5_000  # a real time, in ms
    assert by_id[permanent].attempt == 1
    assert by_id[permanent].failure is not None
    assert by_id[permanent].failure.reason == "permanent"
    assert worker.outcomes["dead_lettered"] == 2


async def test_expired_jobs_do_not_run_and_delayed_jobs_wait(
        app: App, declare: Declare) -> None:
    await declare("timed.job", partitions=1, retry_tiers=["1s", "5s"], max_attempts=2)
    ran: dict[str, int] = {}

    @app.job("timed.job")
    async def timed(job: dict[str, str], ctx: JobContext) -> None:
        ran[job["name"]] = _ms()

    async with app.client() as client:
        await client.enqueue("timed.job", {"name": "expired"}, expires_in=0.001)
        start = _ms()
        await client.enqueue("timed.job", {"name": "delayed"}, delay=1.5)
        await client.enqueue("timed.job", {"name": "now"})
    worker = app.worker("timed.job")
    await worker.run(until_idle=True)

    assert "expired" not in ran
    assert worker.outcomes["expired"] == 1
    assert ran["delayed"] - start >= 1_500
    assert ran["now"] < ran["delayed"]


async def test_bad_records_in_a_lane_are_dead_lettered_and_the_worker_goes_on(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("strict.job", partitions=1)
    ran: list[int] = []

    @app.job("strict.job", ordering="partition")
    async def strict(job: dict[str, int], ctx: JobContext) -> None:
        ran.append(job["n"])

    lane = lane_topic(settings.topic_prefix, "strict.job")
    good = [("sj-job-id", b"good-1"), ("sj-type", b"strict.job")]
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        sends = [
            (b"\x00\xffnot json", [*good[:1], ("sj-type", b"strict.job")]),  # garbage bytes
            (b'{"n": 1}', []),  # headerless
            (b"[1, 2]", [("sj-job-id", b"list-1"), ("sj-type", b"strict.job")]),  # not an object
            (b'{"n": 2}', [("sj-job-id", b"w-1"), ("sj-type", b"other.job")]),  # another type
            (b'{"n": 3}', [("sj-job-id", b"bad-attempt"), ("sj-type", b"strict.job"),
                           ("sj-attempt", b"many")]),  # garbled header
            (b'{"n": 4}', [("sj-job-id", b"fine"), ("sj-type", b"strict.job")]),
        ]
        for value, headers in sends:
            await producer.send_and_wait(lane, value, headers=headers)
    finally:
        await producer.stop()

    worker = app.worker("strict.job")
    await worker.run(until_idle=True)
    assert ran == [4]
    letters = await read_topic(settings, dlq_topic(settings.topic_prefix, "strict.job"))
    reasons = []
    for letter in letters:
        failure = parse_failure(dict(letter.headers).get("sj-error"))
        assert failure is not None
        reasons.append(failure.reason)
    assert reasons == ["bad-json", "missing-header", "invalid-payload", "wrong-type",
                       "bad-header"]
    # The raw bytes are kept as they were.
    assert [letter.value for letter in letters] == [v for v, _ in sends[:5]]
    assert orjson.loads(letters[1].value) == {"n": 1}
    assert worker.outcomes["dead_lettered"] == 5
