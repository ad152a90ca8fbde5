"""What `client.result` answers for a job without a row of kept results, from where the
job lookup finds it (`stream_jobs.lookup.result_error`), and when it looks
(`stream_jobs.client_stores.await_result`), on a fake store and the loop's clock moved by
the store's waits: no services, no sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from stream_jobs.client_stores import LOOK_AFTER_S, await_result
from stream_jobs.errors import (
    BrokerUnavailable,
    JobCancelled,
    JobFailed,
    ResultNotKept,
    ResultTimeout,
)
from stream_jobs.failures import FailureInfo
from stream_jobs.lookup import (
    JobLocation,
    Sighting,
    Status,
    keeps_result,
    not_in_time,
    result_error,
)
from stream_jobs.results.rules import StoredResult

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
KEPT: dict[str, float | None] = {"report.build": 3600.0, "mail.send": None}


def where(status: Status, job_type: str | None = "mail.send", *, role: str = "lane",
          workflow: str | None = None, failure: FailureInfo | None = None) -> JobLocation:
    last = None if status in ("not_seen", "done", "cancelled", "superseded") else Sighting(
        topic=f"p.{job_type}", role=role, name="default", partition=0,  # type: ignore[arg-type]
        offset=7, timestamp_ms=0, attempt=1, behind_commit=status == "finished",
        failure=failure, workflow=workflow)
    return JobLocation("j1", status, job_type if status != "not_seen" else None,
                       None if status == "not_seen" else 1,
                       AT if status == "done" else None, last, detail="why")


def test_a_row_will_come_for_a_type_kept_here_or_a_workflow_member() -> None:
    assert keeps_result(where("pending", "report.build"), KEPT) is True
    assert keeps_result(where("pending", "mail.send"), KEPT) is False
    assert keeps_result(where("pending", "mail.send", workflow="batch:b1"), KEPT) is True
    assert keeps_result(where("pending", "other.type"), KEPT) is None  # no handler here
    assert keeps_result(where("not_seen"), KEPT) is None


def test_a_finished_job_without_a_row_has_no_result_kept() -> None:
    finished = result_error(where("finished"), KEPT)
    assert isinstance(finished, ResultNotKept)
    assert "without a dedup row" in str(finished)
    assert "its type keeps no results (declare it with @app.job(" in str(finished)
    done = result_error(where("done", "report.build"), KEPT)
    assert isinstance(done, ResultNotKept)
    assert str(done).endswith("No result of it is kept: its result was pruned.")
    unknown = result_error(where("done", "other.type"), KEPT)
    assert "or its result was pruned" in str(unknown)


def test_an_ended_job_says_how_it_ended() -> None:
    failure = FailureInfo("max-attempts", "ValueError", "no such page", "", 0)
    dead = result_error(where("dead_lettered", role="dlq", failure=failure), KEPT)
    assert isinstance(dead, JobFailed)
    assert str(dead) == ("Job j1 (mail.send) was dead-lettered after attempt 1: "
                         "max-attempts: ValueError: no such page.")
    assert (dead.state, dead.reason) == ("failed", "max-attempts: ValueError: no such page")
    for status in ("cancelled", "superseded"):
        stopped = result_error(where(status), KEPT)  # type: ignore[arg-type]
        assert isinstance(stopped, JobCancelled)
        assert stopped.state == status


@pytest.mark.parametrize("status", ["pending", "retrying", "scheduled"])
def test_a_waiting_job_whose_type_keeps_nothing_here_never_will(status: Status) -> None:
    never = result_error(where(status, role="tier" if status != "pending" else "lane"), KEPT)
    assert isinstance(never, ResultNotKept)
    assert str(never).startswith("No result of job j1 will be kept: its type keeps no results")
    for waiting in (where(status, "report.build"), where(status, "other.type"),
                    where(status, workflow="chain:0:c1"), where("not_seen")):
        assert result_error(waiting, KEPT) is None


def test_a_timeout_says_where_the_job_is() -> None:
    assert str(not_in_time("j1", 30.04, where("pending"))).startswith(
        "Job j1 has no result after 30 s: it has not finished yet. Job j1 waits in its "
        "default lane, or is running")
    assert "no record of it was found" in str(not_in_time("j1", 0.2, where("not_seen")))
    assert "could not be looked up (Kafka is down)" in str(
        not_in_time("j1", 5, None, "Kafka is down"))


class Store:
    """A `ResultSource` on a clock its waits move: `row` returns at once, `wait_s` later."""

    def __init__(self, where_at: Callable[[float], JobLocation], *,
                 row_at: float | None = None, idle: bool = False,
                 fails: bool = False) -> None:
        self.now = 0.0
        self.where_at = where_at
        self.row_at = row_at
        self.looks: list[tuple[float, str | None]] = []
        self._idle = idle
        self._fails = fails

    async def row(self, job_id: str, wait_s: float) -> StoredResult | None:
        if self.row_at is not None and self.now + wait_s >= self.row_at:
            self.now = max(self.now, self.row_at)
            return StoredResult(job_id, "report.build", "succeeded", '{"n": 1}', None, 1, AT,
                                AT)
        self.now += wait_s
        return None

    async def locate(self, job_id: str, job_type: str | None) -> JobLocation:
        self.looks.append((self.now, job_type))
        if self._fails:
            raise BrokerUnavailable("Kafka did not answer")
        return self.where_at(self.now)

    def idle(self) -> bool:
        return self._idle


async def answer(store: Store, timeout_s: float, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(asyncio.get_running_loop(), "time", lambda: store.now)
    return await await_result(store, "j1", timeout_s, kept=KEPT)


async def test_a_row_in_time_needs_no_look(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(lambda _: where("pending", "report.build"), row_at=0.4)
    assert await answer(store, 30, monkeypatch) == {"n": 1}
    assert store.looks == []


async def test_a_job_whose_row_will_come_is_looked_at_once_more_at_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(lambda _: where("pending", "report.build"))
    with pytest.raises(ResultTimeout, match="after 30 s: it has not finished yet"):
        await answer(store, 30, monkeypatch)
    assert store.looks == [(LOOK_AFTER_S, None), (30.0, "report.build")]


async def test_a_job_of_a_type_not_handled_here_is_looked_at_until_it_finishes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(lambda now: where("finished" if now >= 5 else "pending", "other.type"))
    with pytest.raises(ResultNotKept, match="without a dedup row"):
        await answer(store, 30, monkeypatch)
    # Doubling gaps from the first look, each narrowed to the type found.
    assert store.looks == [(1.0, None), (3.0, "other.type"), (7.0, "other.type")]


async def test_timeout_zero_looks_at_once_and_a_tester_between_runs_answers_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(lambda _: where("pending", "report.build"))
    with pytest.raises(ResultTimeout, match="after 0 s"):
        await answer(store, 0, monkeypatch)
    assert store.looks == [(0.0, None)]
    idle = Store(lambda _: where("pending", "report.build"), idle=True)
    with pytest.raises(ResultTimeout, match="has not finished yet"):
        await answer(idle, 30, monkeypatch)
    assert idle.looks == [(1.0, None)]


async def test_a_lookup_that_fails_leaves_the_wait_for_the_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(lambda _: where("pending"), fails=True)
    with pytest.raises(ResultTimeout, match=r"could not be looked up \(Kafka did not answer"):
        await answer(store, 10, monkeypatch)
    assert [at for at, _ in store.looks] == [1.0, 3.0, 7.0, 10.0]


def test_a_finished_job_whose_rows_postgres_did_not_let_us_read_is_no_answer() -> None:
    # Found by the results chaos trial: during a Postgres restart the lookup read no dedup
    # row and no result (the reads failed), the scan saw the job's offset committed, and
    # `client.result` said "no result is kept: it was pruned" of a job whose result was
    # committed all along.
    unread = replace(where("finished", "report.build"), rows_read=False,
                     notes=("The dedup table was not checked (connection refused).",))
    assert result_error(unread, KEPT) is None
    assert result_error(replace(unread, status="done"), KEPT) is None
    timeout = not_in_time("j1", 30, unread)
    assert "Postgres did not answer for its dedup row and result" in str(timeout)
    assert "connection refused" in str(timeout)


async def test_a_result_committed_while_postgres_was_away_is_returned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    unread = replace(where("finished", "report.build"), rows_read=False)
    store = Store(lambda _: unread, row_at=2.5)
    assert await answer(store, 30, monkeypatch) == {"n": 1}
    assert store.looks == [(1.0, None)]  # looked again soon, not only at the deadline
