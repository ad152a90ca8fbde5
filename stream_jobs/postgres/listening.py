"""A `LISTEN` connection known to be alive.

asyncpg tells a listener when its connection closes, not when it stops answering: behind
a Postgres failover, a stuck load balancer or a dropped route the socket stays open while
bytes go nowhere, and a NOTIFY sent meanwhile never arrives. The three long-lived LISTEN
connections (the cancel watch, the outbox relay's, and the result waits') each keep a
`ListenProbe`: every `interval_s` it asks `SELECT 1` on the connection; an answer later
than `timeout_s`, or an error, means the connection is lost: the probe terminates it (no
goodbye that could hang too) and calls the owner's `on_lost`, which connects again and
catches up with a query (the watch reloads the cancels, the relay runs a round, a result
wait reads its row). So a notice sent into a dead link is late by at most
`interval_s + timeout_s` plus the reconnect, never lost.

An owner that runs its own statement on the connection while a probe is due (the result
waits add channels) makes the probe skip that round: asyncpg refuses a second operation
on a busy connection, and the owner's statement has a timeout of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

log = logging.getLogger("stream_jobs.postgres")

# 5 s + 5 s: a silent link is found within 10 s (a NOTIFY costs nothing meanwhile).
LISTEN_PROBE_INTERVAL_S = 5.0
LISTEN_PROBE_TIMEOUT_S = 5.0


class ListenProbe:
    """Asks the connection `SELECT 1` every `interval_s` until stopped, or until it does
    not answer within `timeout_s`: then terminates it and calls `on_lost()` (once)."""

    def __init__(self, conn: Any, on_lost: Callable[[], None], *, what: str,
                 interval_s: float | None = None, timeout_s: float | None = None) -> None:
        self.conn = conn
        self.on_lost = on_lost
        self.what = what
        # Read when made (not when defined), so a test can shorten the module's figures.
        self.interval_s = LISTEN_PROBE_INTERVAL_S if interval_s is None else interval_s
        self.timeout_s = LISTEN_PROBE_TIMEOUT_S if timeout_s is None else timeout_s
        self.probes = 0  # answered probes
        self._task: asyncio.Task[None] | None = None

    def start(self) -> ListenProbe:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"listen probe: {self.what}")
        return self

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)  # the probe's cadence, not a wait
            if self.conn.is_closed():
                return  # the owner heard of it through its termination listener
            try:
                # asyncio.timeout, not wait_for: wait_for can swallow the cancellation
                # of `stop` when it arrives as the answer does, and never end.
                async with asyncio.timeout(self.timeout_s):
                    await self.conn.fetchval("SELECT 1")
            except asyncpg.InterfaceError:
                if self.conn.is_closed():
                    return
                continue  # busy with the owner's statement: probe next time
            except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
                log.warning("%s: the LISTEN connection did not answer within %.0f s (%s); "
                            "connecting again", self.what, self.timeout_s,
                            type(exc).__name__)
                self.conn.terminate()
                self.on_lost()
                return
            self.probes += 1


__all__ = ["LISTEN_PROBE_INTERVAL_S", "LISTEN_PROBE_TIMEOUT_S", "ListenProbe"]
