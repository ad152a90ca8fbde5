"""Fencing tokens without services: the issuer's coalescing and ordering, the awaitable a
handler reads, the sync form a plain `def` handler calls on its thread, and that a
handler which never reads it costs no request."""

from __future__ import annotations

import ast
import asyncio
import itertools
import re
import threading
from collections.abc import Sequence
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.context import JobContext
from stream_jobs.dedup.fencing import FencingToken, TokenIssuer
from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import ConfigError, DatabaseUnavailable, RunGivenUp
from stream_jobs.postgres.schema import schema_ddl
from stream_jobs.record import JobRecord, Record
from stream_jobs.runtime.threads import HandlerThreads
from stream_jobs.settings import Settings
from tests.waiting import until

from .test_runners import feed
from .test_sync_handlers import SyncMember


class PostgresSequence:
    """A Postgres sequence as the issuer sees it: `fetch(n)` takes n values during the call,
    after `delay` turns of the loop, and returns them in no particular order."""

    def __init__(self, delay: int = 1) -> None:
        self.delay = delay
        self.values = itertools.count(1)
        self.calls: list[int] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_next = False

    async def fetch(self, n: int) -> Sequence[int]:
        self.calls.append(n)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            for _ in range(self.delay):
                await asyncio.sleep(0)
            if self.fail_next:
                self.fail_next = False
                raise DatabaseUnavailable("Postgres did not answer.")
            return [next(self.values) for _ in range(n)][::-1]
        finally:
            self.in_flight -= 1


async def test_a_lone_request_is_one_round_trip() -> None:
    seq = PostgresSequence()
    issuer = TokenIssuer(seq.fetch)
    assert await issuer.request() == 1
    assert await issuer.request() == 2
    assert seq.calls == [1, 1]


async def test_requests_made_together_share_one_round_trip_and_get_distinct_tokens() -> None:
    seq = PostgresSequence()
    issuer = TokenIssuer(seq.fetch)
    tokens = await asyncio.gather(*(issuer.request() for _ in range(5)))
    assert tokens == [1, 2, 3, 4, 5]  # the earliest request gets the lowest
    assert seq.calls == [5]


async def test_requests_during_a_fetch_go_together_in_the_next_one() -> None:
    seq = PostgresSequence(delay=3)
    issuer = TokenIssuer(seq.fetch)
    first = issuer.request()
    await asyncio.sleep(0)  # the fetch for `first` is now in flight
    later = [issuer.request() for _ in range(4)]
    assert await first == 1
    assert await asyncio.gather(*later) == [2, 3, 4, 5]
    assert seq.calls == [1, 4]
    assert seq.most_in_flight == 1


async def test_a_fetch_takes_at_most_batch_max() -> None:
    seq = PostgresSequence()
    issuer = TokenIssuer(seq.fetch, batch_max=2)
    assert sorted(await asyncio.gather(*(issuer.request() for _ in range(5)))) == [1, 2, 3, 4, 5]
    assert seq.calls == [2, 2, 1]
    with pytest.raises(ValueError, match="batch_max"):
        TokenIssuer(seq.fetch, batch_max=0)


async def test_a_failed_fetch_fails_its_requests_and_the_next_request_tries_again() -> None:
    seq = PostgresSequence()
    seq.fail_next = True
    issuer = TokenIssuer(seq.fetch)
    failed = await asyncio.gather(issuer.request(), issuer.request(), return_exceptions=True)
    assert all(isinstance(f, DatabaseUnavailable) for f in failed)
    assert await issuer.request() == 1


async def test_a_cancelled_request_is_not_fetched_for() -> None:
    seq = PostgresSequence()
    issuer = TokenIssuer(seq.fetch)
    gone, kept = issuer.request(), issuer.request()
    gone.cancel()
    assert await kept == 1
    assert seq.calls == [1]


async def test_a_fetch_that_returns_too_few_tokens_fails_its_requests() -> None:
    async def short(n: int) -> list[int]:
        return [1] * (n - 1)

    issuer = TokenIssuer(short)
    with pytest.raises(RuntimeError, match="asked for 2 fencing tokens, got 1"):
        await asyncio.gather(issuer.request(), issuer.request())


async def test_a_stores_round_trips_are_still_counted_after_it_closed() -> None:
    # A worker closes its dedup store when it stops; the bench reads the count after.
    store = DedupStore(Settings())
    seq = PostgresSequence()
    store._fetch_tokens = seq.fetch  # type: ignore[method-assign]
    await asyncio.gather(store.fencing_token(), store.fencing_token())
    await store.fencing_token()
    await store.close()
    assert store.fencing_round_trips == 2 == len(seq.calls)


async def test_close_cancels_what_waits() -> None:
    seq = PostgresSequence(delay=5)
    issuer = TokenIssuer(seq.fetch)
    waiting = [issuer.request(), issuer.request()]
    await asyncio.sleep(0)
    await issuer.close()
    assert all(f.cancelled() for f in waiting)


@settings(max_examples=200, deadline=None)
@given(schedule=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1,
                         max_size=25),
       batch_max=st.integers(1, 4), delay=st.integers(0, 3))
def test_a_token_is_above_every_token_handed_out_before_it_was_asked_for(
        schedule: list[tuple[int, int]], batch_max: int, delay: int) -> None:
    """The fencing property: whatever the arrival pattern, every request gets its own
    token, one asked for after another was handed out gets a larger one, and at most one
    fetch is ever in flight."""

    async def run() -> None:
        seq = PostgresSequence(delay)
        issuer = TokenIssuer(seq.fetch, batch_max=batch_max)
        asked: list[tuple[asyncio.Future[int], list[asyncio.Future[int]]]] = []
        for requests, turns in schedule:
            for _ in range(requests):
                handed_out = [f for f, _ in asked if f.done()]
                asked.append((issuer.request(), handed_out))
            for _ in range(turns):
                await asyncio.sleep(0)
        tokens = await asyncio.gather(*(f for f, _ in asked))
        assert len(set(tokens)) == len(tokens)
        for future, before in asked:
            assert all(earlier.result() < future.result() for earlier in before)
        assert seq.most_in_flight <= 1
        assert all(n <= batch_max for n in seq.calls)
        assert sum(seq.calls) == len(asked)

    asyncio.run(run())


# -- the awaitable a handler reads --------------------------------------------------------


class Requests:
    def __init__(self) -> None:
        self.made: list[asyncio.Future[int]] = []

    def __call__(self) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.made.append(future)
        return future


async def test_every_await_of_one_token_gives_the_same_number() -> None:
    requests = Requests()
    token = FencingToken(requests)
    both = asyncio.gather(token, token)  # overlapping awaits share one request
    await asyncio.sleep(0)
    requests.made[0].set_result(7)
    assert list(await both) == [7, 7]
    assert await token == 7
    assert len(requests.made) == 1


async def test_a_failed_token_is_asked_for_again_on_the_next_await() -> None:
    requests = Requests()
    token = FencingToken(requests)
    first = asyncio.ensure_future(token)
    await asyncio.sleep(0)
    requests.made[0].set_exception(DatabaseUnavailable("Postgres did not answer."))
    with pytest.raises(DatabaseUnavailable):
        await first
    again = asyncio.ensure_future(token)
    await asyncio.sleep(0)
    requests.made[1].set_result(9)
    assert await again == 9


async def test_one_awaiter_cancelled_leaves_the_other_its_token() -> None:
    requests = Requests()
    token = FencingToken(requests)
    cancelled, kept = asyncio.ensure_future(token), asyncio.ensure_future(token)
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    requests.made[0].set_result(3)
    assert await kept == 3
    assert cancelled.cancelled()
    assert len(requests.made) == 1


# -- on the context -----------------------------------------------------------------------


class CountingDedup:
    """Stands in for DedupStore: counts token requests, answers each with the next number."""

    def __init__(self) -> None:
        self.requests = 0

    def fencing_token(self) -> asyncio.Future[int]:
        self.requests += 1
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(100 + self.requests)
        return future


def _context(dedup: CountingDedup) -> JobContext:
    job = JobRecord(job_id="j-1", job_type="doc.index", payload=b"{}", key=None)
    return JobContext(job, topic="jobs.doc.index", partition=0, offset=5,
                      dedup=cast(DedupStore, dedup))


async def test_a_context_whose_token_is_never_read_asks_for_none() -> None:
    dedup = CountingDedup()
    ctx = _context(dedup)
    assert (ctx.job_id, ctx.attempt, ctx.offset) == ("j-1", 1, 5)
    assert "fencing" not in repr(ctx)
    assert dedup.requests == 0


async def test_a_context_asks_once_however_often_the_token_is_read() -> None:
    dedup = CountingDedup()
    ctx = _context(dedup)
    assert await ctx.fencing_token == 101
    assert await ctx.fencing_token == 101
    assert dedup.requests == 1
    # Another delivery of the same job has a context of its own, and a later token.
    assert await _context(dedup).fencing_token == 102


def test_a_handler_cannot_set_the_token() -> None:
    ctx = _context(CountingDedup())
    with pytest.raises(AttributeError):
        ctx.fencing_token = cast(Any, 1)  # type: ignore[misc]


# -- in a plain `def` handler ------------------------------------------------------------


class AnsweredByTheTest:
    """Stands in for DedupStore: each token request waits until the test answers it."""

    def __init__(self) -> None:
        self.made: list[asyncio.Future[int]] = []

    def fencing_token(self) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.made.append(future)
        return future


async def test_a_sync_handler_gets_the_token_an_await_gets_asked_for_once() -> None:
    dedup = CountingDedup()
    threads = HandlerThreads(2, "sj-fencing")
    read: list[int] = []

    def index(job: Any, ctx: JobContext) -> None:
        read.append(ctx.fencing_token_sync())
        read.append(ctx.fencing_token_sync())

    ctx = _context(dedup)
    await threads.start(index, {}, ctx).future
    assert read == [101, 101]
    assert await ctx.fencing_token == 101  # the await and the call share the one token
    assert dedup.requests == 1
    # Another delivery of the same job has a context of its own, and a later token.
    await threads.start(index, {}, _context(dedup)).future
    assert read[2:] == [102, 102]
    threads.close()


async def test_a_sync_handler_that_never_reads_the_token_asks_for_none() -> None:
    dedup = CountingDedup()
    threads = HandlerThreads(1, "sj-fencing")

    def index(job: Any, ctx: JobContext) -> None: ...

    await threads.start(index, {}, _context(dedup)).future
    assert dedup.requests == 0
    threads.close()


async def test_the_handlers_thread_waits_for_its_token_while_the_loop_runs_on() -> None:
    dedup = AnsweredByTheTest()
    threads = HandlerThreads(1, "sj-fencing")
    asked_from: list[str] = []

    def index(job: Any, ctx: JobContext) -> int:
        asked_from.append(threading.current_thread().name)
        return ctx.fencing_token_sync()

    ctx = _context(dedup)
    call = threads.start(index, {}, ctx)
    # The request is made on the loop (the issuer's futures live there), and this test,
    # on the same loop, runs while the thread waits for the answer.
    await until(lambda: len(dedup.made) == 1, "the thread's request reaches the loop")
    assert not call.future.done()
    dedup.made[0].set_result(41)
    returned = await call.future
    assert returned == 41
    assert asked_from == ["sj-fencing-0"]
    threads.close()


async def test_a_failed_sync_token_is_asked_for_again_on_the_next_call() -> None:
    dedup = AnsweredByTheTest()
    threads = HandlerThreads(1, "sj-fencing")
    failures: list[BaseException] = []

    def index(job: Any, ctx: JobContext) -> int:
        try:
            return ctx.fencing_token_sync()
        except DatabaseUnavailable as exc:  # Postgres down: as the await, it raises
            failures.append(exc)
        return ctx.fencing_token_sync()

    ctx = _context(dedup)
    call = threads.start(index, {}, ctx)
    await until(lambda: len(dedup.made) == 1, "the first request")
    dedup.made[0].set_exception(DatabaseUnavailable("Postgres did not answer."))
    await until(lambda: len(dedup.made) == 2, "the request made again")
    dedup.made[1].set_result(9)
    returned = await call.future
    assert (returned, len(failures)) == (9, 1)
    threads.close()


class FencedMember(SyncMember):
    """A SyncMember whose jobs' contexts take their tokens from `dedup`."""

    def __init__(self, func: Any, dedup: CountingDedup, **options: Any) -> None:
        self.dedup = dedup
        super().__init__(func, **options)

    def context_for(self, record: Record) -> JobContext:
        return _context(self.dedup)


async def test_a_thread_its_job_gave_up_on_gets_no_new_token_but_keeps_its_own() -> None:
    """A thread past its timeout runs on, and the job's next run may already hold a token:
    a token taken now would be above that one and let this run's late write win."""
    dedup = CountingDedup()
    gate = threading.Event()
    got: dict[str, Any] = {}

    def index(job: dict[str, int], ctx: JobContext) -> None:
        if job["offset"] == 0:  # took its token first, as it should
            got["before"] = ctx.fencing_token_sync()
            gate.wait(30)
            got["after"] = ctx.fencing_token_sync()
        else:  # asks only once its job has stopped waiting for it
            gate.wait(30)
            try:
                got["late"] = ctx.fencing_token_sync()
            except RunGivenUp as exc:
                got["late"] = exc

    member = FencedMember(index, dedup, concurrency=2, timeout_s=0.2)
    feed(member, 0, [1, 2])  # two keys: both run at once
    await until(lambda: len(member.errors) == 2, "both calls time out")
    assert all(isinstance(e, TimeoutError) for e in member.errors.values())
    gate.set()
    await until(lambda: member.dispatcher.held == 0, "both threads return")
    assert got["after"] == got["before"] == 101
    assert isinstance(got["late"], RunGivenUp), got
    assert "no longer waited for" in str(got["late"])
    assert dedup.requests == 1
    member.threads.close()


async def test_the_sync_form_outside_a_sync_handlers_thread_says_to_await() -> None:
    dedup = CountingDedup()
    ctx = _context(dedup)
    with pytest.raises(ConfigError, match=r"`token = await ctx.fencing_token`"):
        ctx.fencing_token_sync()  # on the loop: in an `async def`
    with pytest.raises(ConfigError, match="plain `def` handler"):
        await asyncio.to_thread(ctx.fencing_token_sync)  # a thread an async handler made
    # A sync handler's context used from the worker's loop: the wait would never end.
    gate = threading.Event()
    threads = HandlerThreads(1, "sj-fencing")
    call = threads.start(lambda job, ctx: gate.wait(30), {}, ctx)
    with pytest.raises(ConfigError, match="plain `def` handler"):
        ctx.fencing_token_sync()
    gate.set()
    await call.future
    assert dedup.requests == 0
    threads.close()


def test_db_migrate_creates_the_sequence_with_no_cache() -> None:
    # CACHE above 1 would let one session hand out numbers below ones another gave.
    [sequence] = [s for s in schema_ddl() if "SEQUENCE" in s]
    assert sequence.startswith("CREATE SEQUENCE IF NOT EXISTS stream_jobs_fencing_tokens")
    assert "CACHE 1" in sequence


# -- the manual's example -----------------------------------------------------------------


def test_the_manuals_fenced_write_is_the_one_the_zombie_test_runs() -> None:
    from pathlib import Path

    from tests.apps import fenced

    page = (Path(__file__).resolve().parents[2] / "docs" / "fencing.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    for block in blocks:
        # Copyable: each block at least compiles (the first one is a line from a handler).
        compile(block, "docs/fencing.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    shown: dict[str, Any] = {}
    exec(blocks[1].split("\n\nclass ")[0], shown)  # its imports and FENCED_WRITE
    assert " ".join(shown["FENCED_WRITE"].split()) == fenced.FENCED_WRITE
