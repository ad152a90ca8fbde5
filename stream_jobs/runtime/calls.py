"""Calling a job's handler within its timeout: on the event loop (`async def`) or on a
thread of the worker's pool (a plain `def`).

Both callers keep one contract, so the worker's outcome paths (success, duplicate,
retry, dead letter, timeout) are the same for both: the call returns what the handler
returned, or raises `RunFailed` with the exception the handler ended with; a
`TimeoutError` when the runner's watchdog cut it off at its deadline
(`stream_jobs.runtime.dispatch`). A revoked or torn-down runner's cancellation is raised
on. The worker picks its caller once, when it is made, so the
async path does not test for the sync one per job.

An async handler past its timeout is cancelled. A thread cannot be: its call has failed
all the same and its job takes the tiers at once, but the thread runs on, and its slot
and its key stay taken until it returns (`Runner.hold`, see `stream_jobs.runtime.threads`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, cast

from stream_jobs.context import JobContext
from stream_jobs.errors import JobInterrupted, RunFailed
from stream_jobs.handlers import AsyncHandlerFunc, JobHandler, SyncHandlerFunc
from stream_jobs.histogram import DurationHistogram
from stream_jobs.results.finish import Finish
from stream_jobs.runtime.dispatch import Runner
from stream_jobs.runtime.threads import HandlerThreads, context_fields

log = logging.getLogger("stream_jobs.worker")

# How a worker calls its handler: what it returned (`RunFailed` if it failed).
HandlerCall = Callable[[Runner, Any, JobContext], Awaitable[object]]


class CallSite(Protocol):
    """What a caller needs of its worker: the watchdog, and the duration histogram (read
    per call: metrics may turn it on after the worker is made)."""

    durations: DurationHistogram | None

    def watch(self) -> None: ...


def timed_out(runner: Runner, timeout_s: float) -> TimeoutError:
    """The error of a call the watchdog cut off; the runner's cancellation is taken back."""
    runner.expired = False
    if runner.task is not None:
        runner.task.uncancel()
    return TimeoutError(f"The handler ran past its timeout of {timeout_s:g} s.")


class _Caller:
    """What both callers keep: where they report, the handler, and its timeout."""

    __slots__ = ("_func", "_site", "_timeout_s", "_watch")

    def __init__(self, site: CallSite, func: Any, timeout_s: float) -> None:
        self._site = site
        self._watch = site.watch
        self._func = func
        self._timeout_s = timeout_s


class LoopCaller(_Caller):
    """An `async def` handler, awaited on the loop; cancelled at its deadline."""

    __slots__ = ()
    _func: AsyncHandlerFunc

    async def call(self, runner: Runner, payload: Any, ctx: JobContext) -> object:
        runner.deadline = asyncio.get_running_loop().time() + self._timeout_s
        self._watch()
        durations = self._site.durations
        started = time.perf_counter() if durations is not None else 0.0
        runner.ctx = ctx  # a cancel finds the run here, and cancels the runner's task
        try:
            returned = await self._func(payload, ctx)
        except asyncio.CancelledError:
            if runner.expired:
                raise RunFailed(timed_out(runner, self._timeout_s)) from None
            if ctx.cancelled:
                raise RunFailed(JobInterrupted(
                    "The run was stopped for a cancel that did not complete.")) from None
            raise  # revoked past the grace period, or the worker is being torn down
        except Exception as exc:
            raise RunFailed(exc) from None
        finally:
            runner.ctx = None
            runner.deadline = math.inf
            if ctx.cancelled and runner.task is not None:
                runner.task.uncancel()  # the cancellation the cancel asked for is consumed
            if durations is not None:
                durations.observe(time.perf_counter() - started)
        if runner.expired:  # the handler swallowed the cancellation and returned
            timed_out(runner, self._timeout_s)
        return returned


class SyncCaller(_Caller):
    """A plain `def` handler, run on a pool thread while the runner awaits its end. At
    its deadline the runner stops waiting; the thread runs on, holding its slot."""

    __slots__ = ("_threads",)
    _func: SyncHandlerFunc

    def __init__(self, site: CallSite, threads: HandlerThreads, func: SyncHandlerFunc,
                 timeout_s: float) -> None:
        super().__init__(site, func, timeout_s)
        self._threads = threads

    async def call(self, runner: Runner, payload: Any, ctx: JobContext) -> object:
        runner.deadline = asyncio.get_running_loop().time() + self._timeout_s
        self._watch()
        durations = self._site.durations
        started = time.perf_counter() if durations is not None else 0.0
        call = self._threads.start(self._func, payload, ctx)
        runner.ctx = ctx  # a cancel finds the run here, and sets ctx.cancelled
        try:
            returned = await call.future
        except asyncio.CancelledError:
            runner.hold = call.outlived()
            if runner.hold is not None:
                log.warning("job %s (%s) attempt %d: its handler thread cannot be stopped "
                            "and runs on; its slot and its key stay taken until it returns",
                            ctx.job_id, ctx.job_type, ctx.attempt, extra=context_fields(ctx))
            if not runner.expired:
                raise  # revoked past the grace period, or the worker is being torn down
            raise RunFailed(timed_out(runner, self._timeout_s)) from None
        except Exception as exc:
            raise RunFailed(exc) from None
        finally:
            runner.ctx = None
            runner.deadline = math.inf
            if durations is not None:
                durations.observe(time.perf_counter() - started)
        if runner.expired:  # the call returned as the watchdog fired
            timed_out(runner, self._timeout_s)
        return returned


def handler_call(site: CallSite, handler: JobHandler) -> tuple[HandlerCall, HandlerThreads | None]:
    """The worker's call of `handler`, and the thread pool it runs on (None: the loop)."""
    if not handler.sync:
        # Registration found it `async def` (`JobHandler.sync` is False).
        func = cast(AsyncHandlerFunc, handler.func)
        return LoopCaller(site, func, handler.timeout_s).call, None
    threads = HandlerThreads(handler.concurrency, f"sj-{handler.job_type}")
    return SyncCaller(site, threads, handler.func, handler.timeout_s).call, threads


async def call_finished(call: HandlerCall, finish: Finish, runner: Runner, payload: Any,
                        ctx: JobContext,
                        lend_slot: Callable[[], AbstractContextManager[None]]) -> None:
    """The handler of a job with a finish transaction (stream_jobs.results.finish), called
    through `call`: its result, dedup row, effects and counters commit when it returns.
    `RunFailed` with the handler's error, `AlreadyDone` for a duplicate, or why the
    finish failed."""
    error: Exception | None = await finish.before()
    returned: object = None
    if error is None:
        try:
            returned = await call(runner, payload, ctx)
        except RunFailed as failed:
            error = failed.error
        except BaseException:
            await finish.abandon()  # revoked or torn down: nothing of it commits
            raise
    error = await finish.after(error, returned, lend_slot)
    if error is not None:
        raise RunFailed(error)
