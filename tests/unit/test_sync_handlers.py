"""Sync handlers without services: registration, the thread pool, the sync caller's
timeout and held slot (on the group member's runners, as `test_runners` drives them), and
`once_sync`'s transaction on a recording DB-API connection."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.dedup.store import DedupStore
from stream_jobs.dedup.sync_once import done_table, once_in
from stream_jobs.errors import AlreadyDone, ConfigError, DedupWriteFailed, RunFailed
from stream_jobs.handlers import new_handler
from stream_jobs.record import JobRecord, Record
from stream_jobs.runtime.calls import SyncCaller
from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.threads import HandlerThreads
from stream_jobs.settings import Settings

from .test_runners import Member, feed, until


class Page(BaseModel):
    url: str


# -- registration ---------------------------------------------------------------------------


def test_a_plain_def_registers_as_sync_with_its_payload_model() -> None:
    app = App(Settings())

    @app.job("pdf.render", concurrency=3)
    def render(job: Page, ctx: JobContext) -> None: ...

    @app.job("pdf.index")
    async def index(job: dict[str, Any], ctx: JobContext) -> None: ...

    sync, unsync = app.handler("pdf.render"), app.handler("pdf.index")
    assert (sync.sync, sync.model, sync.concurrency) == (True, Page, 3)
    assert (unsync.sync, unsync.model) == (False, None)
    assert render.__name__ == "render"  # the decorator hands the function back


def test_what_is_not_a_plain_or_async_function_is_refused() -> None:
    class Handler:
        async def __call__(self, job: dict[str, Any], ctx: JobContext) -> None: ...

    with pytest.raises(ConfigError, match="must be a function"):
        new_handler("a.b", Handler(), timeout=1, concurrency=1, ordering="key")

    def gen(job: dict[str, Any], ctx: JobContext) -> Any:
        yield job

    async def agen(job: dict[str, Any], ctx: JobContext) -> Any:
        yield job

    for func in (gen, agen):
        with pytest.raises(ConfigError, match="is a generator"):
            new_handler("a.b", func, timeout=1, concurrency=1, ordering="key")
    with pytest.raises(ConfigError, match="must take"):
        new_handler("a.b", lambda job: None, timeout=1, concurrency=1, ordering="key")


# -- the thread pool ------------------------------------------------------------------------


def _ctx(job_id: str = "j-1") -> JobContext:
    job = JobRecord(job_id=job_id, job_type="pdf.render", payload=b"{}", key=None)
    return JobContext(job, topic="t", partition=0, offset=0, dedup=DedupStore(Settings()))


REQUEST = contextvars.ContextVar("REQUEST", default="none")


async def test_the_pool_runs_calls_on_its_threads_and_hands_back_how_they_ended() -> None:
    pool = HandlerThreads(2, "sj-test")
    seen: list[tuple[str, str]] = []

    def ok(job: Any, ctx: JobContext) -> None:
        seen.append((threading.current_thread().name, REQUEST.get()))

    def boom(job: Any, ctx: JobContext) -> None:
        raise ValueError("no")

    def sneaky(job: Any, ctx: JobContext) -> Any:
        async def later() -> None: ...
        return later()

    REQUEST.set("req-7")  # copied into the call, as asyncio.to_thread does
    calls = [pool.start(f, {}, _ctx()) for f in (ok, boom, sneaky, ok)]
    assert pool.busy == 4
    results = await asyncio.gather(*(c.future for c in calls), return_exceptions=True)
    assert results[0] is None
    assert results[3] is None
    assert isinstance(results[1], ValueError)
    assert isinstance(results[2], ConfigError)
    assert "declare it `async def`" in str(results[2])
    assert {name for name, _ in seen} <= {"sj-test-0", "sj-test-1"}
    assert {request for _, request in seen} == {"req-7"}
    assert (pool.busy, pool.overdue, pool.overdue_total) == (0, 0, 0)
    pool.close()


# -- the sync caller on the runners -------------------------------------------------------


class SyncMember(Member):
    """A member whose records run `func` through a `SyncCaller`, as the worker's do."""

    def __init__(self, func: Any, *, concurrency: int, timeout_s: float,
                 grace_s: float = 1.0) -> None:
        self.durations = None
        self.threads = HandlerThreads(concurrency, "sj-unit")
        self.caller = SyncCaller(self, self.threads, func, timeout_s)
        self.errors: dict[int, Exception | None] = {}  # by offset
        super().__init__(self._through_caller, concurrency=concurrency, grace_s=grace_s)

    def context_for(self, record: Record) -> JobContext:
        return _ctx(f"j-{record.offset}")

    async def _through_caller(self, member: Member, work: PartitionWork, record: Record,
                              runner: Runner) -> None:
        ctx = self.context_for(record)
        try:
            await self.caller.call(runner, {"offset": record.offset}, ctx)
        except RunFailed as failed:
            self.errors[record.offset] = failed.error
        else:
            self.errors[record.offset] = None


async def test_a_thread_past_its_timeout_fails_its_job_and_keeps_its_slot_and_key() -> None:
    gate = threading.Event()
    started: list[int] = []

    def handler(job: dict[str, int], ctx: JobContext) -> None:
        started.append(job["offset"])
        if job["offset"] == 0:
            gate.wait(30)  # stuck until the test lets it go

    member = SyncMember(handler, concurrency=2, timeout_s=0.2)
    # Offsets 0 and 1 share key 7; offsets 2 and 3 have keys of their own.
    work = feed(member, 0, [7, 7, 8, 9])
    await until(lambda: len(member.errors) == 3, "the stuck call times out, 2 and 3 run")
    assert isinstance(member.errors[0], TimeoutError)
    assert "0.2 s" in str(member.errors[0])
    # Its record is finished (its outcome is the worker's to write), but its thread runs
    # on: one slot stays taken, and the next job of its key waits for it.
    assert sorted(started) == [0, 2, 3]
    assert (member.threads.busy, member.threads.overdue, member.dispatcher.held) == (1, 1, 1)
    assert work.tracker is not None
    assert work.tracker.position == 1
    gate.set()
    await until(lambda: len(member.errors) == 4, "the key's next job runs once the thread ends")
    assert started[-1] == 1
    assert (member.threads.busy, member.threads.overdue, member.dispatcher.held) == (0, 0, 0)
    assert member.threads.overdue_total == 1
    assert work.tracker.position == 4
    member.threads.close()


async def test_held_slots_count_against_concurrency() -> None:
    gate = threading.Event()
    calls_at_once: list[int] = []

    def handler(job: dict[str, int], ctx: JobContext) -> None:
        # Calls started and not returned, as the pool counts them (queued ones included).
        calls_at_once.append(member.threads.busy)
        # Two stick; the others take long enough that the two time out meanwhile.
        gate.wait(30 if job["offset"] < 2 else 0.05)

    member = SyncMember(handler, concurrency=3, timeout_s=0.2)
    feed(member, 0, list(range(12)))  # 12 keys: nothing waits for a key
    # Two calls stick past their timeout; the other ten run one at a time in the slot
    # left, each on a free thread at once: none waits for one and times out.
    await until(lambda: len(member.errors) == 12, "every job ends")
    assert max(calls_at_once) <= 3, calls_at_once
    assert sorted(o for o, e in member.errors.items() if isinstance(e, TimeoutError)) == [0, 1]
    assert member.dispatcher.held == 2
    gate.set()
    await until(lambda: member.dispatcher.held == 0, "the held slots are released")
    member.threads.close()


async def test_revocation_abandons_a_stuck_thread_whose_slot_stays_held() -> None:
    gate = threading.Event()

    def handler(job: dict[str, int], ctx: JobContext) -> None:
        gate.wait(30)

    member = SyncMember(handler, concurrency=2, timeout_s=30, grace_s=0.1)
    stuck = feed(member, 0, [None])
    await until(lambda: member.threads.busy == 1, "the call runs")
    await member.release([stuck.tp])
    # Past the grace period the record is abandoned (the next owner runs it again), but
    # the thread cannot be, so its slot is held until it returns.
    assert stuck.tracker is not None
    assert stuck.tracker.position == 0
    assert (member.threads.overdue, member.dispatcher.held) == (1, 1)
    gate.set()
    await until(lambda: member.dispatcher.held == 0, "the slot comes back")
    assert member.threads.overdue == 0
    member.threads.close()


# -- once_sync on a DB-API connection -----------------------------------------------------


class Cursor:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.rowcount = -1

    def execute(self, sql: str, params: tuple[Any, ...]) -> None:
        if self.conn.fail_claim:
            raise RuntimeError('relation "stream_jobs_done" does not exist')
        self.conn.log.append(("execute", sql, params))
        self.rowcount = 0 if params[0] in self.conn.done else 1

    def close(self) -> None: ...


class Connection:
    """A DB-API connection that records what is done with it (no database)."""

    def __init__(self, *, done: tuple[str, ...] = (), autocommit: bool = False,
                 fail_claim: bool = False, fail_commit: bool = False) -> None:
        self.done = set(done)
        self.autocommit = autocommit
        self.fail_claim = fail_claim
        self.fail_commit = fail_commit
        self.log: list[tuple[Any, ...]] = []

    def cursor(self) -> Cursor:
        return Cursor(self)

    def commit(self) -> None:
        if self.fail_commit:
            raise RuntimeError("server closed the connection")
        self.log.append(("commit",))

    def rollback(self) -> None:
        self.log.append(("rollback",))


def _once(conn: Any, job_id: str = "j-1") -> Any:
    return once_in(conn, job_id=job_id, job_type="pdf.render", attempt=2,
                   table=done_table("app"))


def test_once_sync_claims_then_commits_the_body_with_the_row() -> None:
    conn = Connection()
    with _once(conn) as held:
        assert held is conn
        conn.log.append(("effect",))
    [claim, effect, commit] = conn.log
    assert claim[1].startswith('INSERT INTO "app".stream_jobs_done (job_id, job_type, attempt)')
    assert "ON CONFLICT (job_id) DO NOTHING" in claim[1]
    assert claim[2] == ("j-1", "pdf.render", 2)
    assert (effect, commit) == (("effect",), ("commit",))


def test_once_sync_skips_the_body_of_a_finished_job_and_rolls_back_a_failing_one() -> None:
    conn = Connection(done=("j-1",))
    ran = False
    with pytest.raises(AlreadyDone), _once(conn):
        ran = True
    assert not ran
    assert conn.log[-1] == ("rollback",)
    conn = Connection()
    with pytest.raises(ValueError, match="bad page"), _once(conn):
        raise ValueError("bad page")
    assert [entry[0] for entry in conn.log] == ["execute", "rollback"]


def test_once_sync_says_what_went_wrong_in_one_sentence() -> None:
    with pytest.raises(DedupWriteFailed, match=r'"app"\.stream_jobs_done.*db migrate'), \
            _once(Connection(fail_claim=True)):
        pass
    broken = Connection(fail_commit=True)
    with pytest.raises(DedupWriteFailed, match="commit of job j-1's dedup row"), _once(broken):
        pass
    assert broken.log[-1] == ("rollback",)
    with pytest.raises(ConfigError, match="autocommit"), _once(Connection(autocommit=True)):
        pass
    with pytest.raises(ConfigError, match="needs a SQLAlchemy Session"), _once(object()):
        pass
    assert done_table('we"ird') == '"we""ird".stream_jobs_done'
