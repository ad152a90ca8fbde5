"""The cancelled job IDs of the types a process runs, in memory, kept current by
LISTEN/NOTIFY on one connection per process; and, the same way, the attempts
`stream-jobs retry-now` released from their delay tier early (`released`), which the relay
does not release again and the workers skip (stream_jobs/retry_now/).

A worker checks every job against its type's `ids` before it starts, which costs a set
lookup and no query. The sets are filled as each type's worker starts and after every
reconnect: the watch LISTENs first and reads the table second, so a cancel committed in
between is seen either way (twice is harmless). Each cancel NOTIFYs in its own
transaction, so the notice arrives as it commits (within milliseconds here) and the watch
tells the type's subscribers, which interrupt a job that is running.

One `CancelWatch` serves every worker of a process (`Storage.cancel_feed` hands out one
`TypeCancels` per type): a process running ten types holds one LISTEN connection, not
ten. The connection opens when the first type's worker starts and closes when the last
one stops.

The connection is asked `SELECT 1` every few seconds (`stream_jobs/postgres/listening.py`):
one that stops answering (a Postgres that hangs, a dead route) is dropped and connected
again, and the reload finds the cancels whose notices went into the dead link, so a cancel
sent then interrupts its running job within about 10 s of the link's return.

If Postgres does not answer, the worker starts anyway with what it has and the watch
keeps trying in the background (backing off to 5 s), then reloads. Meanwhile a job
cancelled in that gap may start; if it writes through `ctx.once()` its claim still
meets the cancel's dedup row, so it commits nothing and finishes as cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

import asyncpg

from stream_jobs.cancels.rules import (
    NoticeKind,
    ReleasedKey,
    channel,
    concerns,
    parse_notice,
    released_key,
)
from stream_jobs.cancels.store import CancelStore
from stream_jobs.errors import StreamJobsError
from stream_jobs.postgres.listening import ListenProbe
from stream_jobs.postgres.pool import DRIVER_ERRORS
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.cancels")

APPLICATION_NAME = "stream-jobs cancel watch"
FIRST_LOAD_TIMEOUT_S = 5.0
RECONNECT_TIMEOUT_S = 15.0
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.2, 5.0

OnCancel = Callable[[str], None]
# What a connect-and-load attempt may end with, all retried.
_ATTEMPT_ERRORS: tuple[type[BaseException], ...] = (StreamJobsError, TimeoutError,
                                                    *DRIVER_ERRORS)


class CancelFeed(Protocol):
    """What a worker reads of its type's cancels: `TypeCancels` on Postgres, or
    `stream_jobs.testing`'s in-memory one. The meanings are `TypeCancels`'."""

    @property
    def ids(self) -> set[str]: ...

    @property
    def released(self) -> set[ReleasedKey]: ...

    def subscribe(self, on_cancel: OnCancel, *,
                  on_interrupt: OnCancel | None = None) -> None: ...

    def subscribe_released(self, on_release: OnCancel) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def confirmed(self, job_id: str, within_s: float) -> bool: ...

    async def is_cancelled(self, job_id: str) -> bool: ...


class TypeCancels:
    """One type's part of the watch. `ids` holds the type's cancelled job IDs;
    `subscribe(f)` calls `f(job_id)` for each cancel that arrives (or that a reload
    finds), and `subscribe(..., on_interrupt=g)` `g(job_id)` for each interrupt asked for
    (a cancel waiting on a run's open `ctx.once()`), on the event loop. `start` and
    `stop` join and leave the process's watch."""

    def __init__(self, watch: CancelWatch, job_type: str) -> None:
        self.watch = watch
        self.job_type = job_type
        self.ids: set[str] = set()
        # Attempts released early by retry-now (stream_jobs/retry_now/): only grows, like
        # `ids`, until the process restarts; a few per operator action.
        self.released: set[ReleasedKey] = set()
        self._subscribers: list[OnCancel] = []
        self._interrupters: list[OnCancel] = []
        self._releasers: list[OnCancel] = []
        self._awaited: dict[str, asyncio.Future[None]] = {}  # confirmed() waits

    @property
    def loads(self) -> int:
        """Successful loads of the table by the watch: 0 until the first one."""
        return self.watch.loads

    @property
    def _conn(self) -> Any:
        return self.watch._conn

    def subscribe(self, on_cancel: OnCancel, *, on_interrupt: OnCancel | None = None) -> None:
        self._subscribers.append(on_cancel)
        if on_interrupt is not None:
            self._interrupters.append(on_interrupt)

    def subscribe_released(self, on_release: OnCancel) -> None:
        """Call `on_release(job_id)` for each attempt released early that a notice tells
        (the relay wakes the held record with it)."""
        self._releasers.append(on_release)

    async def start(self) -> None:
        """Join the watch: this type's IDs are loaded (within FIRST_LOAD_TIMEOUT_S, else
        in the background) and its notices delivered from now on."""
        await self.watch.attach(self)

    async def stop(self) -> None:
        await self.watch.detach(self)

    async def confirmed(self, job_id: str, within_s: float) -> bool:
        """Whether `job_id` is cancelled, waiting up to `within_s` for its notice (after
        an interrupt the cancel commits within milliseconds), then asking Postgres."""
        if job_id in self.ids:
            return True
        waiter = self._awaited.get(job_id)
        if waiter is None:
            waiter = self._awaited[job_id] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), within_s)
            return True
        except TimeoutError:
            return await self.watch.store.is_cancelled(job_id)
        finally:
            if self._awaited.get(job_id) is waiter:
                del self._awaited[job_id]

    async def is_cancelled(self, job_id: str) -> bool:
        """Whether `job_id` is cancelled, asking Postgres when the set does not have it
        (for a run that found its dedup row taken: a cancel, or an earlier run)."""
        if job_id in self.ids:
            return True
        return await self.watch.store.is_cancelled(job_id)

    def found(self, ids: set[str], released: set[ReleasedKey] | None = None) -> None:
        """IDs a load of the table found: the new ones are told as cancels; and the
        attempts released early."""
        for job_id in ids - self.ids:
            self.add(job_id)
        self.released |= released or set()

    def add(self, job_id: str) -> None:
        self.ids.add(job_id)
        waiter = self._awaited.get(job_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._tell(self._subscribers, job_id)

    def tell_released(self, job_id: str) -> None:
        self._tell(self._releasers, job_id)

    def interrupt(self, job_id: str) -> None:
        self._tell(self._interrupters, job_id)

    def _tell(self, subscribers: list[OnCancel], job_id: str) -> None:
        for on_cancel in subscribers:
            try:
                on_cancel(job_id)
            except Exception:  # a subscriber's bug must not stop the others hearing it
                log.exception("%s: a cancel subscriber failed on %s", self.job_type, job_id)


class CancelWatch:
    """One LISTEN connection for the types of a process (`feed(job_type)` each), open
    while at least one of them has started."""

    def __init__(self, settings: Settings, *, store: CancelStore | None = None) -> None:
        self.settings = settings
        self.store = store or CancelStore(settings)
        self._owns_store = store is None
        self.loads = 0  # successful loads of the table: 0 until the first one
        self.silent_links = 0  # connections the probe found silent and dropped
        self._feeds: dict[str, TypeCancels] = {}
        self._started: list[TypeCancels] = []
        self._guard = asyncio.Lock()  # attach and detach one at a time
        self._channel = channel(settings.database_schema)
        self._conn: Any = None
        self._probe: ListenProbe | None = None  # asks the connection whether it is alive
        self._lost = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None

    def feed(self, job_type: str) -> TypeCancels:
        """The type's part of the watch (one per type: workers of a type share it)."""
        feed = self._feeds.get(job_type)
        if feed is None:
            feed = self._feeds[job_type] = TypeCancels(self, job_type)
        return feed

    async def attach(self, feed: TypeCancels) -> None:
        """Deliver to `feed` from now on: the first one opens the connection (its first
        attempt bounded by FIRST_LOAD_TIMEOUT_S, then retried in the background); a later
        one has its type's IDs loaded on the open connection."""
        async with self._guard:
            self._started.append(feed)
            if self._keeper is None:
                await self._first_connect()
                self._keeper = asyncio.create_task(self._keep())
            elif self._conn is not None:
                try:
                    found = await asyncio.wait_for(self._load(feed), FIRST_LOAD_TIMEOUT_S)
                except _ATTEMPT_ERRORS as exc:
                    self._not_loaded(feed.job_type, exc)
                    self._lost.set()  # the reconnect reloads every type
                    return
                feed.found(*found)

    async def detach(self, feed: TypeCancels) -> None:
        """Stop delivering to `feed`; the last one closes the connection."""
        async with self._guard:
            if feed in self._started:
                self._started.remove(feed)
            if self._started or self._keeper is None:
                return
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
            await self._drop()
            if self._owns_store:
                await self.store.close()

    # -- the connection -----------------------------------------------------------------------

    async def _first_connect(self) -> None:
        try:
            await asyncio.wait_for(self._connect(), FIRST_LOAD_TIMEOUT_S)
        except _ATTEMPT_ERRORS as exc:
            self._not_loaded(", ".join(self._types()), exc)
            self._lost.set()

    def _types(self) -> list[str]:
        return sorted({feed.job_type for feed in self._started})

    def _not_loaded(self, types: str, exc: BaseException) -> None:
        log.warning("%s: cancels not loaded yet (%s); jobs start meanwhile, and the "
                    "watch keeps trying", types, _said(exc))

    async def _connect(self) -> None:
        try:
            conn = await asyncpg.connect(
                self.settings.listen_url, timeout=10,
                server_settings={"search_path": self.settings.database_schema,
                                 "application_name": APPLICATION_NAME})
        except DRIVER_ERRORS as exc:
            raise StreamJobsError(f"cannot connect to Postgres: {_said(exc)}") from exc
        try:
            await conn.add_listener(self._channel, self._notified)
            conn.add_termination_listener(self._terminated)
            feeds = list(dict.fromkeys(self._started))
            found = [await self._load(feed) for feed in feeds]
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
            raise
        self._conn = conn
        self._probe = ListenProbe(conn, self._link_lost, what="cancel watch").start()
        self._lost.clear()
        self.loads += 1
        for feed, (ids, released) in zip(feeds, found, strict=True):
            feed.found(ids, released)

    async def _load(self, feed: TypeCancels) -> tuple[set[str], set[ReleasedKey]]:
        return (await self.store.cancelled_ids(feed.job_type),
                await self.store.released_early(feed.job_type))

    async def _keep(self) -> None:
        """Reconnect (and reload) whenever the connection is lost, backing off."""
        backoff_s = _BACKOFF_FIRST_S
        while True:
            await self._lost.wait()
            await self._drop()
            try:
                # Bounded: a Postgres that hangs must not keep the watch from trying again.
                async with asyncio.timeout(RECONNECT_TIMEOUT_S):
                    await self._connect()
            except _ATTEMPT_ERRORS as exc:
                log.warning("%s: cancel watch cannot reach Postgres (%s); trying again in "
                            "%.1f s", ", ".join(self._types()), _said(exc), backoff_s)
                await asyncio.sleep(backoff_s)  # a backoff, not a wait for a condition
                backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)
                continue
            backoff_s = _BACKOFF_FIRST_S
            log.info("%s: cancel watch connected; %d cancelled IDs known",
                     ", ".join(self._types()), sum(len(f.ids) for f in self._feeds.values()))

    async def _drop(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            await probe.stop()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)

    def _terminated(self, *_: object) -> None:
        self._lost.set()

    def _link_lost(self) -> None:
        """The probe found the connection silent (it terminated it)."""
        self.silent_links += 1
        self._lost.set()

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        found = parse_notice(payload)
        if found is None:
            return
        for feed in dict.fromkeys(self._started):
            if not concerns(found.job_type, feed.job_type):
                continue
            if found.kind is NoticeKind.INTERRUPT:
                feed.interrupt(found.job_id)
            elif found.kind is NoticeKind.RELEASED:
                key = released_key(found.job_id)
                if key is not None:
                    feed.released.add(key)
                    feed.tell_released(key[0])
            elif found.job_id not in feed.ids:
                feed.add(found.job_id)


def _said(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


__all__ = ["CancelFeed", "CancelWatch", "OnCancel", "TypeCancels"]
