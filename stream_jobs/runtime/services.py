"""Services: what runs beside the work, started in order and stopped in reverse.

A worker process's services run beside its workers (`stream_jobs.runtime.host`), and a
worker's run beside its lanes (`stream_jobs.runtime.worker`): its cancels, its control
topic, its reports, its delay relay, its heartbeats, its type's scheduler. Each has the
same shape, `Service`; a loop that only needs to run until it is stopped is a `Loop`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol


class Service(Protocol):
    """Something that runs beside the work: `start` returns once it runs (a loop of its
    own is a task it creates); `stop` ends it."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Loop:
    """A service that is one coroutine, run as a task: `start` awaits `ready` (if given),
    then makes the task; `stop` cancels it, waits for its end, then awaits `ended` (if
    given). Stopping one that never started, or whose `ready` failed, runs `ended` only."""

    def __init__(self, name: str, run: Callable[[], Coroutine[Any, Any, None]], *,
                 ready: Callable[[], Awaitable[None]] | None = None,
                 ended: Callable[[], Awaitable[None]] | None = None) -> None:
        self.name = name
        self._run = run
        self._ready = ready
        self._ended = ended
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._ready is not None:
            await self._ready()
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Its end, whatever it was: a loop that failed meanwhile has nothing to report.
            await asyncio.gather(task, return_exceptions=True)
        if self._ended is not None:
            await self._ended()


@asynccontextmanager
async def running(services: Sequence[Service]) -> AsyncIterator[None]:
    """Start `services` in order; when the block ends (or a start fails), stop those that
    started, in reverse."""
    started: list[Service] = []
    try:
        for service in services:
            await service.start()
            started.append(service)
        yield
    finally:
        for service in reversed(started):
            await service.stop()


__all__ = ["Loop", "Service", "running"]
