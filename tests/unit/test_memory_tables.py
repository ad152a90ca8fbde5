"""The in-memory rows of the JobTester: the runtime's own statements (a workflow's plan,
the finish of its members, a cancel, a key) carried out as their SQL says."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.client import Job, JobClient
from stream_jobs.errors import UnknownStatement
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.postgres.names import named
from stream_jobs.record import JobRecord, decode_record
from stream_jobs.results.finish import Finisher, record_ending
from stream_jobs.settings import Settings
from stream_jobs.testing.memory_dedup import MemoryDedup
from stream_jobs.testing.memory_tables import MemoryTables, RawRecord
from stream_jobs.unique.rules import KeyClaim
from stream_jobs.workflows.create import batch_plan

SCHEMA = "tables_test"
TYPES = {name: JobTypePolicy.from_toml({"partitions": 1}, job_type=name)
         for name in ("member", "callback")}


def batch_of(tables: MemoryTables, size: int) -> list[JobRecord]:
    """A batch "B" of `size` members with both callbacks, made by its real plan."""
    client = JobClient(Settings(database_schema=SCHEMA), TYPES)
    plan = batch_plan(SCHEMA, "B", [Job("member", {"n": n}, job_id=f"m{n}")
                                    for n in range(size)], client.prepare,
                      on_success=Job("callback", {"slot": "success"}),
                      on_complete=Job("callback", {"slot": "complete"}))
    _, rows = tables.commit(None, plan.statements)
    return [decode_record(key=key, value=value, headers=headers, expected_type="member",
                          max_payload_bytes=1 << 20) for _, key, value, headers in rows]


EVENTS = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["succeeded", "ended"])),
                  max_size=30)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 4), events=EVENTS)
def test_a_batchs_callbacks_are_sent_once_whatever_the_order_and_redeliveries(
        size: int, events: list[tuple[int, str]]) -> None:
    """Members end and succeed in any order, again and again (redeliveries, a dead letter
    requeued): each callback is written at most once, when its condition first holds."""
    sent: list[RawRecord] = []
    store = MemoryDedup(SCHEMA, sent.extend)
    members = batch_of(store.tables, size)
    finisher = Finisher.of(store, Settings(database_schema=SCHEMA), "member", None)
    stopping = asyncio.Event()
    succeeded: set[int] = set()
    finished: set[int] = set()

    async def play() -> None:
        for n, kind in events:
            if n >= size:
                continue
            job = members[n]
            if kind == "succeeded":
                finish = finisher.finish_for(job)
                assert finish is not None
                await finish.after(None, None)  # a duplicate is refused: AlreadyDone
                succeeded.add(n)
            else:
                await record_ending(finisher, job, "failed", "max-attempts", stopping)
            finished.add(n)

    asyncio.run(play())
    slots = [orjson.loads(value or b"{}")["slot"] for _, _, value, _ in sent]
    assert slots.count("complete") == (1 if len(finished) == size else 0)
    assert slots.count("success") == (1 if len(succeeded) == size else 0)
    batch = store.tables.workflows["B"]
    assert batch.succeeded == len(succeeded)
    assert batch.failed == len(finished - succeeded)


def test_a_unique_key_is_held_until_its_job_finished_and_its_window_passed() -> None:
    tables = MemoryTables(SCHEMA)
    claim = KeyClaim("unique", "k", None)
    assert tables.take_key(claim, "member", "a").sent
    assert tables.take_key(claim, "member", "b").holder == "a"
    tables.release_key("member", "k", "b")  # not the holder: nothing changes
    assert tables.take_key(claim, "member", "c").holder == "a"
    tables.release_key("member", "k", "a")
    assert tables.take_key(claim, "member", "c").sent


def test_a_cancel_and_a_run_are_one_or_the_other() -> None:
    tables = MemoryTables(SCHEMA)
    assert tables.cancel("j", None, None).changed
    with pytest.raises(Exception, match="already finished"):
        tables.commit(("j", "member", 1), [("UPDATE t SET x = 1", ())])
    assert "j" not in {job for job, row in tables.done.items() if row.attempt}
    tables.commit(("k", "member", 1), [])
    assert not tables.cancel("k", None, None).changed


def test_a_runtime_statement_the_tables_do_not_know_is_refused_not_taken_for_an_effect() -> None:
    tables = MemoryTables(SCHEMA)
    unknown = named(f'UPDATE "{SCHEMA}".stream_jobs_someday SET n = n + 1 WHERE id = $1',
                    "someday.count")
    with pytest.raises(UnknownStatement, match=r"someday\.count"):
        tables.commit(("job-1", "t", 1), [("INSERT INTO mine VALUES ($1)", (1,)),
                                          (unknown, ("x",))])
    assert "job-1" not in tables.done  # refused before anything changed
    # A handler's own statement, even one naming a table of ours, is its effect.
    own = f'UPDATE "{SCHEMA}".stream_jobs_someday SET n = 0'
    effects, rows = tables.commit(("job-2", "t", 1), [(own, ())])
    assert effects == [(own, ())]
    assert rows == []
    assert "job-2" in tables.done
