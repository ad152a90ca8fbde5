"""Deferred writes: how many jobs' recorded statements are grouped for `executemany`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.dedup.deferred import ColumnStatement, DeferredWrites, Statement, stages

sql_texts = st.sampled_from(["INSERT a", "INSERT b", "UPDATE c"])
statement = st.tuples(sql_texts, st.tuples(st.integers()))
jobs = st.lists(st.lists(statement, max_size=4), max_size=12)


def flatten(plan: list[list[tuple[str, list[tuple[Any, ...]]]]]) -> list[Statement]:
    return [(sql, args) for stage in plan for sql, rows in stage for args in rows]


@given(jobs)
def test_every_statement_runs_once(per_job: list[list[Statement]]) -> None:
    assert sorted(flatten(stages(per_job)), key=repr) == sorted(
        (s for job in per_job for s in job), key=repr)


@given(jobs)
def test_each_jobs_statements_keep_their_order(per_job: list[list[Statement]]) -> None:
    # Tag every statement with its job and position, then read the plan back per job.
    tagged = [[(sql, (j, k)) for k, (sql, _) in enumerate(job)] for j, job in enumerate(per_job)]
    seen: dict[int, list[int]] = {}
    for _, (j, k) in flatten(stages(tagged)):
        seen.setdefault(j, []).append(k)
    assert all(order == sorted(order) for order in seen.values())
    assert {j: len(v) for j, v in seen.items()} == {j: len(job) for j, job in
                                                     enumerate(per_job) if job}


def test_a_stage_holds_one_executemany_per_sql_text() -> None:
    per_job: list[list[Statement]] = [
        [("INSERT a", (1,)), ("UPDATE c", (1,))],
        [("INSERT a", (2,))],
        [("INSERT b", (3,)), ("UPDATE c", (3,))],
    ]
    assert stages(per_job) == [
        [("INSERT a", [(1,), (2,)]), ("INSERT b", [(3,)])],
        [("UPDATE c", [(1,), (3,)])],
    ]


def test_a_recording_keeps_statements_in_order_and_refuses_non_sql() -> None:
    writes = DeferredWrites()

    async def record() -> None:
        await writes.execute("INSERT INTO t VALUES ($1)", 1)
        await writes.executemany("INSERT INTO u VALUES ($1, $2)", [(2, "x"), (3, "y")])
        with pytest.raises(TypeError, match="SQL text"):
            await writes.execute("  ")

    asyncio.run(record())
    assert writes.statements == [("INSERT INTO t VALUES ($1)", (1,)),
                                 ("INSERT INTO u VALUES ($1, $2)", (2, "x")),
                                 ("INSERT INTO u VALUES ($1, $2)", (3, "y"))]


def test_a_column_statement_groups_with_its_text_and_carries_its_many_form() -> None:
    finish = ColumnStatement("SELECT $1", "SELECT unnest($1::text[])", "finish.test")
    grouped = stages([[("INSERT x", (1,)), (finish, ("a",))], [(finish, ("b",))]])
    assert grouped[0] == [("INSERT x", [(1,)]), ("SELECT $1", [("b",)])]
    key = grouped[0][1][0]
    assert isinstance(key, ColumnStatement)
    assert key.many == "SELECT unnest($1::text[])"
    assert grouped[1] == [("SELECT $1", [("a",)])]
