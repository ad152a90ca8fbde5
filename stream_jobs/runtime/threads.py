"""Sync handlers: a plain `def` handler runs on a thread of its worker's pool.

The runner that starts a job hands the call to a pool thread and awaits its end on the
loop, within the handler's timeout (`stream_jobs.runtime.calls.SyncCaller`); the outcome
paths after that are the async ones (`stream_jobs.runtime.worker`). The pool holds at
most `concurrency` threads, one per dispatch slot, so a job never waits for a thread and
its timeout measures its run only.

A thread cannot be stopped. A call past its timeout has failed (its job goes to the next
tier at once, like an async timeout), and a call whose job was abandoned (revocation or
shutdown past the grace period) is left to its next owner; in both cases the thread runs
on until the function returns, and until then it keeps its slot and its job's key:
the dispatcher counts the slot as taken (`Runner.hold`), so the worker never runs more
than `concurrency` handlers at once, and the next job of the key waits, so two jobs of
one key never run at the same time. Such calls are counted (`overdue`,
`overdue_total`, exported as Prometheus metrics) and logged when they finally return.

The handler's `ctx.fencing_token_sync()` takes its token on the loop, as an async
handler's await does, while the thread waits (`ThreadCall.loop`); a call the job no
longer waits for gets none it did not already have (`ThreadCall.waited`).

The threads are daemon threads: a worker that stops with a call still running does not
wait for it (that call's job was abandoned, so its offset was not committed; the process
exit ends the thread and its open transaction rolls back).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from stream_jobs.context import JobContext
from stream_jobs.errors import ConfigError

log = logging.getLogger("stream_jobs.worker")

SyncFunc = Callable[[Any, JobContext], object]


class ThreadCall:
    """One handler call on a pool thread, as the loop sees it. Everything but `run` and
    `loop` (which never changes) is called on the loop's thread, so the counters need no
    lock."""

    __slots__ = ("_late", "_loop", "_overdue_since", "_pool", "args", "ended", "func",
                 "future")

    def __init__(self, pool: HandlerThreads, loop: asyncio.AbstractEventLoop, func: SyncFunc,
                 args: tuple[Any, JobContext]) -> None:
        self._pool = pool
        self._loop = loop
        self.func = func
        self.args = args
        # Resolved with what the function returned, unless the runner stopped waiting for it.
        self.future: asyncio.Future[object] = loop.create_future()
        self.ended = False
        self._late: asyncio.Future[None] | None = None
        self._overdue_since = 0.0
        # How `ctx.fencing_token_sync()` reaches the loop from the thread (and asks
        # whether the job still waits for this call).
        args[1]._sync_call = self

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def waited(self) -> bool:
        """On the loop: whether the job still waits for this call. Its runner stops at
        the call's timeout or when the job is abandoned (cancelling `future`), and the
        call's end resolves it."""
        return not self.future.done()

    def run(self, context: contextvars.Context) -> None:
        """On a pool thread: call the function and tell the loop how it ended."""
        error: BaseException | None = None
        result: object = None
        try:
            result = context.run(self.func, *self.args)
            if inspect.isawaitable(result):
                if inspect.iscoroutine(result):
                    result.close()  # never awaited: silence the warning, we report it
                name = getattr(self.func, "__qualname__", repr(self.func))
                error = ConfigError(f"Handler {name} returned an awaitable from a plain "
                                    "`def`: declare it `async def` so the worker awaits it.")
        except BaseException as exc:  # delivered to the runner, which decides
            error = exc
        # RuntimeError: the loop is closed, the worker is gone and nobody waits for this call.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._finish, error, result)

    def _finish(self, error: BaseException | None, result: object) -> None:
        self.ended = True
        pool = self._pool
        pool.busy -= 1
        future = self.future
        if not future.cancelled():
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
        late = self._late
        if late is not None:
            pool.overdue -= 1
            ctx = self.args[1]
            log.warning("job %s (%s) attempt %d: its handler thread returned %.1f s after "
                        "the job stopped waiting for it; its slot is free again",
                        ctx.job_id, ctx.job_type, ctx.attempt,
                        time.monotonic() - self._overdue_since, extra=context_fields(ctx))
            if not late.done():
                late.set_result(None)

    def outlived(self) -> asyncio.Future[None] | None:
        """After the runner stopped waiting (timeout, abandoned): None if the function
        already returned, else a future resolved when it does (counted overdue until then)."""
        if self.ended:
            return None
        if self._late is None:
            self._late = self._loop.create_future()
            self._overdue_since = time.monotonic()
            self._pool.overdue += 1
            self._pool.overdue_total += 1
        return self._late


class HandlerThreads:
    """Up to `size` daemon threads that run sync handlers, started as they are needed."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self.name = name
        self._calls: SimpleQueue[tuple[ThreadCall, contextvars.Context] | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        # Calls started and not yet returned; of those, calls nobody waits for any more.
        self.busy = 0
        self.overdue = 0
        # Calls that ever outlived their job's wait (a counter, for Prometheus).
        self.overdue_total = 0

    def start(self, func: SyncFunc, payload: Any, ctx: JobContext) -> ThreadCall:
        """Run `func(payload, ctx)` on a pool thread (in a copy of the caller's context
        variables, as `asyncio.to_thread` does); await the call's `future` for its end."""
        call = ThreadCall(self, asyncio.get_running_loop(), func, (payload, ctx))
        self.busy += 1
        if self.busy > len(self._threads) and len(self._threads) < self.size:
            thread = threading.Thread(target=self._serve, daemon=True,
                                      name=f"{self.name}-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()
        self._calls.put((call, contextvars.copy_context()))
        return call

    def _serve(self) -> None:
        calls = self._calls
        while (item := calls.get()) is not None:
            call, context = item
            call.run(context)

    def close(self) -> None:
        """Let idle threads end; a thread still in a call ends after it (or with the
        process: they are daemon threads)."""
        if self.busy:
            log.warning("%s: %d handler threads still running as the worker stops; they end "
                        "with the process, and their jobs run again on the next owner",
                        self.name, self.busy)
        for _ in self._threads:
            self._calls.put(None)
        self._threads.clear()


def context_fields(ctx: JobContext) -> dict[str, Any]:
    """The log fields of a line about the running job `ctx` (see `stream_jobs.logs`)."""
    return {"job_type": ctx.job_type, "job_id": ctx.job_id, "attempt": ctx.attempt,
            "topic": ctx.topic, "partition": ctx.partition, "offset": ctx.offset}
