"""The DLQ tools against the real stack: list, show, requeue (also killed halfway), purge."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import orjson
import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.dlq.letters import Verdict, parse_since
from stream_jobs.dlq.listing import list_letters
from stream_jobs.dlq.requeue import SelectAll, SelectIds, SelectReason, chunk_size, requeue
from stream_jobs.errors import LetterNotFound
from stream_jobs.failures import FailureInfo
from stream_jobs.job_ids import new_job_id
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.kafka.scan import partitions_of
from stream_jobs.naming import dlq_topic, lane_topic
from stream_jobs.record import JobRecord, dead_letter_headers, decode_record
from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env

from .conftest import Declare
from .topic_reader import read_topic

CLI = str(Path(sys.executable).with_name("stream-jobs"))


def _ms() -> int:
    return int(time.time() * 1000)


async def _fill(settings: Settings, job_type: str, count: int, *, reason: str = "max-attempts",
                requeues: int = 0, lane: str = "default", attempt: int = 4,
                job_ids: list[str] | None = None, failed_ago_ms: int = 0) -> list[str]:
    """Write `count` dead letters as the worker writes them; returns their job IDs."""
    now = _ms()
    failure = FailureInfo(reason, "RuntimeError", "downstream is down",
                          'Traceback (most recent call last):\n  File "h.py", line 3, in '
                          "handler\nRuntimeError: downstream is down\n", now - failed_ago_ms)
    ids = job_ids or [new_job_id() for _ in range(count)]
    records = [JobRecord(job_id=job_id, job_type=job_type, payload=orjson.dumps({"n": i}),
                         key=job_id.encode(), attempt=attempt, enqueued_at_ms=now - 60_000,
                         lane=lane, origin=f"{lane_topic(settings.topic_prefix, job_type)}/0/{i}",
                         failure=failure, requeues=requeues)
               for i, job_id in enumerate(ids)]
    async with JobProducer(settings) as producer:
        await producer.send_many([(dlq_topic(settings.topic_prefix, job_type), r)
                                  for r in records])
    return ids


async def _fill_raw(settings: Settings, job_type: str, value: bytes) -> str:
    """A dead letter of bytes that are not a job, as the worker writes one."""
    failure = FailureInfo("bad-json", "stream_jobs.errors.BadRecord", "not JSON", "", _ms())
    headers = dead_letter_headers([("sj-type", job_type.encode())], failure=failure,
                                  origin="elsewhere/0/1", job_type=job_type)
    async with JobProducer(settings) as producer:
        await producer.send_raw(dlq_topic(settings.topic_prefix, job_type), None, value, headers)
    return dict(headers)["sj-job-id"].decode()


async def _lane_records(settings: Settings, job_type: str, lane: str = "default") -> int:
    topic = lane_topic(settings.topic_prefix, job_type, lane)
    async with open_reader(settings) as consumer:
        parts = await partitions_of(consumer, topic)
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in parts])
    return sum(ends.values())


def _env(settings: Settings) -> dict[str, str]:
    return settings_env(settings)


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def _cli(settings: Settings, *args: str) -> Ran:
    """Run `stream-jobs ARGS` as an operator would, with this test's settings."""
    proc = await asyncio.create_subprocess_exec(CLI, *args, env=_env(settings),
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def _one_line_error(done: Ran, *words: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]


async def _effects_table(settings: Settings) -> asyncpg.Connection:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    # No unique constraint: a duplicated effect would show up as a second row.
    await conn.execute("CREATE TABLE effects (job_id text NOT NULL, attempt int NOT NULL)")
    return conn


def _register_effects(app: App, job_type: str, broken: list[bool]) -> None:
    @app.job(job_type, concurrency=64, ordering="unordered")
    async def handler(job: dict[str, int], ctx: JobContext) -> None:
        if broken[0]:
            raise RuntimeError("downstream is down")
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO effects (job_id, attempt) VALUES ($1, $2)",
                               ctx.job_id, ctx.attempt)


async def test_a_thousand_dead_letters_are_requeued_and_each_runs_once(
        app: App, declare: Declare, settings: Settings) -> None:
    """1,000 letters, the handler fixed, `dlq requeue --all` killed about halfway and run
    again: every job runs once, none is lost, a re-sent letter is a dedup hit."""
    await declare("bulk.fail", partitions=4, max_attempts=1, retry_tiers=["1s"])
    broken = [True]
    _register_effects(app, "bulk.fail", broken)
    conn = await _effects_table(settings)
    rate_per_s = 200.0
    try:
        async with app.client() as client:
            ids = await client.enqueue_many([Job("bulk.fail", {"n": i}) for i in range(1_000)])
        failing = app.worker("bulk.fail")
        await failing.run(until_idle=True)
        assert failing.outcomes["dead_lettered"] == 1_000
        listing = await list_letters(settings, "bulk.fail", limit=0)
        assert (listing.letters, listing.reasons, listing.pending_drain) == (
            1_000, {"max-attempts": 1_000}, 1_000)

        broken[0] = False  # the fix is deployed
        proc = await asyncio.create_subprocess_exec(
            CLI, "dlq", "requeue", "bulk.fail", "--all", "--rate", f"{rate_per_s:g}/s",
            env=_env(settings), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            async with open_reader(settings) as consumer:
                lane = lane_topic(settings.topic_prefix, "bulk.fail")
                tps = [TopicPartition(lane, p) for p in await partitions_of(consumer, lane)]
                deadline = time.monotonic() + 60
                while sum((await consumer.end_offsets(tps)).values()) < 1_500:
                    assert proc.returncode is None, "the requeue ended before it was killed"
                    assert time.monotonic() < deadline, "the requeue did not start within 60 s"
                    await asyncio.sleep(0.02)  # polling interval, bounded by the deadline
        finally:
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
        assert proc.returncode == -signal.SIGKILL
        at_kill = await _lane_records(settings, "bulk.fail") - 1_000
        assert 500 <= at_kill < 1_000, at_kill
        pending = (await list_letters(settings, "bulk.fail", limit=0)).pending_drain
        assert 0 < pending <= 1_000 - at_kill + chunk_size(rate_per_s)

        finished = await _cli(settings, "dlq", "requeue", "bulk.fail", "--all")
        assert finished.returncode == 0, finished.stderr
        assert f"will requeue {pending:,} as their next attempt" in finished.stdout
        assert f"Requeued {pending:,} letters" in finished.stdout
        sent = await _lane_records(settings, "bulk.fail") - 1_000
        # Letters sent but not yet committed when it died are sent again: one chunk at most.
        assert 1_000 <= sent <= 1_000 + chunk_size(rate_per_s)
        assert (await list_letters(settings, "bulk.fail", limit=0)).pending_drain == 0

        fixed = app.worker("bulk.fail")
        await fixed.run(until_idle=True)
        assert fixed.outcomes["succeeded"] == 1_000
        assert fixed.outcomes["duplicate"] == sent - 1_000
        assert set(fixed.outcomes) <= {"succeeded", "duplicate"}
        rows = await conn.fetch("SELECT job_id, attempt FROM effects")
        assert sorted(r["job_id"] for r in rows) == sorted(ids)  # each effect exactly once
        assert {r["attempt"] for r in rows} == {2}  # the requeue is the next attempt

        # Safe to run again: the drain position is past every letter, nothing is resent.
        again = await requeue(settings, "bulk.fail", select=SelectAll())
        assert (again.plan.read, again.requeued) == (0, 0)
        assert await _lane_records(settings, "bulk.fail") == 1_000 + sent
    finally:
        await conn.close()


async def test_purge_needs_yes_and_then_empties_the_dlq(declare: Declare,
                                                          settings: Settings) -> None:
    await declare("purge.fail", partitions=2)
    await _fill(settings, "purge.fail", 30)

    refused = await _cli(settings, "dlq", "purge", "purge.fail")
    _one_line_error(refused, "Refusing to delete 30 letters", "--yes")
    assert (await list_letters(settings, "purge.fail", limit=0)).letters == 30

    done = await _cli(settings, "dlq", "purge", "purge.fail", "--yes")
    assert done.returncode == 0, done.stderr
    assert "Deleted 30 letters" in done.stdout
    assert (await list_letters(settings, "purge.fail", limit=0)).letters == 0

    again = await _cli(settings, "dlq", "purge", "purge.fail", "--yes")
    assert again.returncode == 0, again.stderr
    assert "nothing to purge" in again.stdout
    # A drain after a purge starts at what is left (nothing), without an error.
    drained = await requeue(settings, "purge.fail", select=SelectAll())
    assert (drained.plan.read, drained.requeued) == (0, 0)


async def test_list_groups_by_reason_and_show_prints_a_letter(declare: Declare,
                                                                settings: Settings) -> None:
    await declare("mixed.fail", partitions=2, priorities=["high", "default"])
    timed_out = await _fill(settings, "mixed.fail", 3, reason="timeout", lane="high")
    old_permanent = await _fill(settings, "mixed.fail", 2, reason="permanent",
                                failed_ago_ms=2 * 3_600_000)
    raw_id = await _fill_raw(settings, "mixed.fail", b"\x00\xffnot json")

    # Independent reads run side by side: each CLI start costs a couple of seconds.
    listed, table, shown, raw, by_reason, recent, dry = await asyncio.gather(
        _cli(settings, "dlq", "list", "mixed.fail", "--json"),
        _cli(settings, "dlq", "list", "mixed.fail", "--limit", "2"),
        _cli(settings, "dlq", "show", "mixed.fail", timed_out[1]),
        _cli(settings, "dlq", "show", "mixed.fail", raw_id, "--json"),
        _cli(settings, "dlq", "list", "mixed.fail", "--reason", "timeout", "--json"),
        _cli(settings, "dlq", "list", "mixed.fail", "--since", "1h", "--json"),
        _cli(settings, "dlq", "requeue", "mixed.fail", "--reason", "timeout", "--dry-run",
             "--reset-attempts"))
    for ran in (listed, table, shown, raw, by_reason, recent, dry):
        assert ran.returncode == 0, ran.stderr

    # --reason and --since select rows; the histogram still covers the whole DLQ.
    timeouts = json.loads(by_reason.stdout)
    assert sorted(r["job_id"] for r in timeouts["rows"]) == sorted(timed_out)
    assert (timeouts["matching"], timeouts["reasons"]["permanent"]) == (3, 2)
    since = json.loads(recent.stdout)
    assert sorted(r["job_id"] for r in since["rows"]) == sorted([*timed_out, raw_id])
    assert not set(old_permanent) & {r["job_id"] for r in since["rows"]}
    # The dry run says what it would do and sends nothing.
    assert "will requeue 3 at attempt 1 (lanes: high 3)" in dry.stdout
    assert "Dry run: nothing was changed." in dry.stdout
    assert await _lane_records(settings, "mixed.fail", "high") == 0

    listing = json.loads(listed.stdout)
    assert listing["reasons"] == {"timeout": 3, "permanent": 2, "bad-json": 1}
    assert listing["letters"] == listing["matching"] == len(listing["rows"]) == 6
    assert (listing["jobs"], listing["repeats"], listing["matching_jobs"]) == (6, 0, 6)
    assert {r["letters"] for r in listing["rows"]} == {1}
    raw_row = next(r for r in listing["rows"] if r["job_id"] == raw_id)
    assert raw_row["runnable"] is False
    some = next(r for r in listing["rows"] if r["job_id"] == timed_out[0])
    assert (some["attempt"], some["requeues"], some["error_class"]) == (4, 0, "RuntimeError")
    assert some["failed_at"].endswith("+00:00")

    later = await list_letters(settings, "mixed.fail",
                               since_ms=parse_since("2999-01-01T00:00:00", _ms()))
    assert (later.matching, later.rows) == (0, [])

    # The histogram first, then the most recent rows.
    assert table.stdout.index("bad-json") < table.stdout.index("2 of 6 matching jobs")
    assert "4 older matching jobs are not shown" in table.stdout
    assert '"n": 1' in shown.stdout  # the payload, pretty
    assert "RuntimeError: downstream is down" in shown.stdout  # the traceback
    detail = json.loads(raw.stdout)
    assert (detail["payload"], detail["problem"]) == ("b'\\x00\\xffnot json'", "bad-json")

    unknown_type, unknown_id, bad_time, reset = await asyncio.gather(
        _cli(settings, "dlq", "list", "no.such.type"),
        _cli(settings, "dlq", "show", "mixed.fail", "no-such-id"),
        _cli(settings, "dlq", "list", "mixed.fail", "--since", "last tuesday"),
        _cli(settings, "dlq", "requeue", "mixed.fail", "--reason", "timeout",
             "--reset-attempts"))
    _one_line_error(unknown_type, "Unknown job type")
    _one_line_error(unknown_id, "no-such-id")
    _one_line_error(bad_time, "--since")

    # --reset-attempts starts each job again at attempt 1, on its own lane.
    assert reset.returncode == 0, reset.stderr
    assert "Requeued 3 letters" in reset.stdout
    sent = await read_topic(settings, lane_topic(settings.topic_prefix, "mixed.fail", "high"))
    jobs = [decode_record(key=r.key, value=r.value, headers=r.headers,
                          expected_type="mixed.fail", max_payload_bytes=10**6) for r in sent]
    assert sorted(j.job_id for j in jobs) == sorted(timed_out)
    assert {(j.attempt, j.requeues, j.failure) for j in jobs} == {(1, 1, None)}


async def test_selected_requeues_leave_what_cannot_or_should_not_run(
        declare: Declare, settings: Settings) -> None:
    await declare("pick.fail", partitions=2, priorities=["high", "default"])
    permanent = await _fill(settings, "pick.fail", 2, reason="permanent", lane="high",
                            attempt=1)
    looping = await _fill(settings, "pick.fail", 1, requeues=3)
    # One job dead-lettered twice: only its newest letter counts.
    twice = await _fill(settings, "pick.fail", 1, reason="timeout")
    await _fill(settings, "pick.fail", 1, reason="timeout", requeues=1, job_ids=twice)
    raw_id = await _fill_raw(settings, "pick.fail", b"{broken")

    with pytest.raises(LetterNotFound, match="nothing was requeued"):
        await requeue(settings, "pick.fail", select=SelectIds(frozenset({permanent[0], "nope"})))

    by_reason = await requeue(settings, "pick.fail", select=SelectReason("permanent"))
    assert (by_reason.requeued, dict(by_reason.plan.lanes)) == (2, {"high": 2})
    latest = await requeue(settings, "pick.fail", select=SelectReason("timeout"),
                           reset_attempts=True)
    assert (latest.plan.selected, latest.plan.superseded, latest.requeued) == (2, 1, 1)

    held = await requeue(settings, "pick.fail", select=SelectIds(frozenset({*looping, raw_id})))
    assert held.requeued == 0
    assert held.plan.verdicts == {Verdict.LOOP_GUARD: 1, Verdict.UNDECODABLE: 1}
    assert held.plan.samples[Verdict.LOOP_GUARD] == looping
    dry = await requeue(settings, "pick.fail", select=SelectIds(frozenset(looping)), force=True,
                        dry_run=True)
    assert (dry.plan.to_requeue, dry.requeued) == (1, 0)
    forced = await requeue(settings, "pick.fail", select=SelectIds(frozenset(looping)),
                           force=True)
    assert forced.requeued == 1

    high = await read_topic(settings, lane_topic(settings.topic_prefix, "pick.fail", "high"))
    default = await read_topic(settings, lane_topic(settings.topic_prefix, "pick.fail"))
    jobs = {}
    for record in [*high, *default]:
        job = decode_record(key=record.key, value=record.value, headers=record.headers,
                            expected_type="pick.fail", max_payload_bytes=10**6)
        assert job.failure is None
        assert job.not_before_ms is None
        assert job.key == job.job_id.encode()
        jobs[job.job_id] = job
    assert [j.lane for j in jobs.values()].count("high") == 2
    assert {jid: jobs[jid].attempt for jid in permanent} == {jid: 2 for jid in permanent}
    assert (jobs[twice[0]].attempt, jobs[twice[0]].requeues) == (1, 2)
    assert (jobs[looping[0]].attempt, jobs[looping[0]].requeues) == (5, 4)
    assert len(high) + len(default) == 4  # nothing else was sent

    # The drain still sees every letter: selections never move the group.
    assert (await list_letters(settings, "pick.fail", limit=0)).pending_drain == 6


async def test_one_letter_is_counted_as_one(settings: Settings, declare: Declare) -> None:
    await declare("one.letter", partitions=1)
    [job_id] = await _fill(settings, "one.letter", 1)
    listed = await _cli(settings, "dlq", "list", "one.letter")
    assert listed.returncode == 0, listed.stderr
    text = " ".join(listed.stdout.split())
    assert (f"{dlq_topic(settings.topic_prefix, 'one.letter')} holds 1 letter of 1 "
            "dead-lettered job (0 repeats" in text)
    assert "1 letter is after the drain position" in text
    assert "1 of 1 matching job, one row per job, its newest letter, most recent last" in text
    assert "1 letters" not in text
    assert "1 jobs" not in text

    requeued = await _cli(settings, "dlq", "requeue", "one.letter", "--id", job_id)
    assert requeued.returncode == 0, requeued.stderr
    text = " ".join(requeued.stdout.split())
    assert "looked at 1 letter; 1 selected, of 1 job" in text
    assert "will requeue 1 as its next attempt" in text
    assert "Requeued 1 letter." in text


async def test_requeue_all_sends_one_letter_per_job_the_newest(settings: Settings,
                                                               declare: Declare) -> None:
    """Three jobs, two of them with a second letter (a killed worker's, a requeue that
    died again): the list counts 3 jobs and 5 letters, `--all` sends 3 and says it
    skipped 2 repeats, and what it sends is each job's newest letter."""
    await declare("twice.fail", partitions=2)
    ids = await _fill(settings, "twice.fail", 3)
    await _fill(settings, "twice.fail", 2, requeues=1, job_ids=ids[:2], reason="timeout")

    listed = await _cli(settings, "dlq", "list", "twice.fail", "--json")
    assert listed.returncode == 0, listed.stderr
    listing = json.loads(listed.stdout)
    assert (listing["letters"], listing["jobs"], listing["repeats"]) == (5, 3, 2)
    assert listing["job_reasons"] == {"timeout": 2, "max-attempts": 1}
    assert sorted((r["job_id"], r["letters"], r["requeues"]) for r in listing["rows"]) == \
        sorted([(ids[0], 2, 1), (ids[1], 2, 1), (ids[2], 1, 0)])
    every = await list_letters(settings, "twice.fail", per_letter=True)
    assert (len(every.rows), every.jobs) == (5, 3)

    done = await _cli(settings, "dlq", "requeue", "twice.fail", "--all")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "looked at 5 letters; 5 selected, of 3 jobs" in text
    assert "skipping 2 repeats" in text
    assert "Requeued 3 letters (one per job; 2 repeats skipped)" in text
    assert "the drain position moved past 5" in text
    sent = await read_topic(settings, lane_topic(settings.topic_prefix, "twice.fail"))
    jobs = sorted((j.job_id, j.requeues) for j in (
        decode_record(key=r.key, value=r.value, headers=r.headers, expected_type="twice.fail",
                      max_payload_bytes=10**6) for r in sent))
    assert jobs == sorted([(ids[0], 2), (ids[1], 2), (ids[2], 1)])
    again = await requeue(settings, "twice.fail", select=SelectAll())
    assert (again.plan.read, again.requeued) == (0, 0)
    # Requeue by ID still sends the job's newest letter.
    by_id = await requeue(settings, "twice.fail", select=SelectIds(frozenset({ids[0]})))
    assert (by_id.plan.selected, by_id.plan.superseded, by_id.requeued) == (2, 1, 1)
