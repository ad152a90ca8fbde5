"""Cancels, unique keys, debounce, results and workflows of a `JobTester` without Postgres.

Three in-memory stand-ins over one `MemoryTables`, each behind the seam the runtime has
for it, so what runs is the runtime's own code:

- `MemoryCancels`, a worker's `CancelFeed` (`stream_jobs.cancels.watch`): the set of
  its type's cancelled IDs, told of each cancel as it commits and of each interrupt a
  cancel asks for (it waits on a run's open `ctx.once()`), as the LISTEN connection is;
- `MemoryKeys`, a worker's `Keys` (`stream_jobs.unique.release`): unique keys given back and
  debounced jobs asked after;
- `MemoryStores`, the clients' `ClientStores` (`stream_jobs.client_stores`): `cancel`,
  unique and debounced `enqueue`, `result`, `chain`, `batch`, `progress` and `status`.

A job that a unique or debounced enqueue sends is written to the broker at once, as the
outbox relay would write its committed row. `result` waits and looks as the real one
does (`stream_jobs.client_stores.await_result`, in real time, up to its timeout) only
while the tester runs its workers: between runs nothing can finish, so it answers at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from stream_jobs.cancels.rules import (
    CLAIM_WAIT_S,
    INTERRUPT_WAIT_S,
    MARKER_ATTEMPT,
    Cancellation,
    concerns,
)
from stream_jobs.cancels.watch import OnCancel
from stream_jobs.client_stores import await_result
from stream_jobs.errors import CancelPending, UnknownWorkflow
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka import TopicPartition
from stream_jobs.lookup import (
    JobLocation,
    Sighting,
    cancelled_location,
    judge,
    sighting_of,
    superseded_location,
    topics_of,
)
from stream_jobs.results.rules import StoredResult
from stream_jobs.settings import Settings
from stream_jobs.testing.broker import MemoryBroker
from stream_jobs.testing.memory_dedup import Publish
from stream_jobs.testing.memory_tables import MemoryTables, at
from stream_jobs.unique.claim import Build, KeyAnswer
from stream_jobs.unique.rules import KeyClaim
from stream_jobs.workflows.create import Plan
from stream_jobs.workflows.members import CALLBACK_SLOTS
from stream_jobs.workflows.progress import Progress


class MemoryCancels:
    """The `CancelFeed` of one type's worker (see the module)."""

    def __init__(self, tables: MemoryTables, job_type: str) -> None:
        self._tables = tables
        self.job_type = job_type
        self.ids: set[str] = set()
        # Retry-now is Postgres's (stream_jobs/retry_now/): nothing is released early here.
        self.released: set[tuple[str, int, int]] = set()
        self._subscribers: list[OnCancel] = []
        self._interrupters: list[OnCancel] = []
        self._awaited: dict[str, asyncio.Future[None]] = {}  # confirmed() waits
        self._unsubscribe: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0

    def subscribe(self, on_cancel: OnCancel, *, on_interrupt: OnCancel | None = None) -> None:
        self._subscribers.append(on_cancel)
        if on_interrupt is not None:
            self._interrupters.append(on_interrupt)

    def subscribe_released(self, on_release: OnCancel) -> None:
        """Nothing is released early in memory (see `released`)."""

    async def start(self) -> None:
        self._loop, self._thread = asyncio.get_running_loop(), threading.get_ident()
        stops = [self._tables.on_cancel(lambda t, j: self._hop(t, j, self._add)),
                 self._tables.on_interrupt(lambda t, j: self._hop(t, j, self._interrupt))]

        def unsubscribe() -> None:
            for stop in stops:
                stop()

        self._unsubscribe = unsubscribe
        for job_id in self._tables.cancelled_ids(self.job_type) - self.ids:
            self._add(job_id)

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    async def confirmed(self, job_id: str, within_s: float) -> bool:
        """Whether `job_id` is cancelled, waiting up to `within_s` for the cancel that
        interrupted its run to be written (it is, as soon as the run's block ended)."""
        if await self.is_cancelled(job_id):
            return True
        waiter = self._awaited.setdefault(job_id, asyncio.get_running_loop().create_future())
        try:
            await asyncio.wait_for(asyncio.shield(waiter), within_s)
        except TimeoutError:
            return await self.is_cancelled(job_id)
        finally:
            self._awaited.pop(job_id, None)
        return True

    async def is_cancelled(self, job_id: str) -> bool:
        return job_id in self.ids or job_id in self._tables.cancels

    def _hop(self, job_type: str, job_id: str, then: OnCancel) -> None:
        """`then(job_id)` on the worker's loop, for a cancel of this type from any thread."""
        if not concerns(job_type, self.job_type):
            return
        loop = self._loop
        if loop is None or threading.get_ident() == self._thread:
            then(job_id)
        elif not loop.is_closed():  # a sync client's cancel, from its own thread
            loop.call_soon_threadsafe(then, job_id)

    def _add(self, job_id: str) -> None:
        if job_id in self.ids:
            return
        self.ids.add(job_id)
        waiter = self._awaited.get(job_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        for on_cancel in self._subscribers:
            on_cancel(job_id)

    def _interrupt(self, job_id: str) -> None:
        for on_interrupt in self._interrupters:
            on_interrupt(job_id)


class MemoryKeys:
    """The `Keys` of a worker (see the module)."""

    def __init__(self, tables: MemoryTables) -> None:
        self._tables = tables

    async def release_until_done(self, job_type: str, unique_key: str, job_id: str,
                                 stopping: asyncio.Event) -> None:
        self._tables.release_key(job_type, unique_key, job_id)

    async def superseded_by(self, job_id: str) -> str | None:
        return self._tables.superseded.get(job_id)

    async def close(self) -> None:
        pass


class MemoryStores:
    """The `ClientStores` of a tester's clients (see the module). `running()` says whether
    the tester's workers run now."""

    def __init__(self, settings: Settings, tables: MemoryTables, broker: MemoryBroker,
                 publish: Publish, running: Callable[[], bool]) -> None:
        self.settings = settings
        self.tables = tables
        self._broker = broker
        self._publish = publish
        self._running = running

    async def cancel(self, job_id: str, *, job_type: str | None,
                     reason: str | None) -> Cancellation:
        """As `CancelStore.cancel`: a run inside `ctx.once()` holds the job's claim, so the
        cancel waits `CLAIM_WAIT_S` for it, then asks for an interrupt and waits for the
        run's block to end: it wins if the block rolled back, and answers "already
        finished" if it committed."""
        asked = False
        while (answer := self.tables.cancel(job_id, job_type, reason)) is None:
            wait_s = INTERRUPT_WAIT_S if asked else CLAIM_WAIT_S
            if not await self._released(job_id, wait_s):
                if asked:
                    raise CancelPending(
                        f"Job {job_id} is in a ctx.once() block that did not end within "
                        f"{INTERRUPT_WAIT_S:g} s of being asked to stop; cancel again later "
                        "to learn whether it committed.")
                self.tables.ask_interrupt(job_type or "", job_id)
                asked = True
        return answer

    async def _released(self, job_id: str, within_s: float) -> bool:
        """Whether no run holds `job_id`'s claim, waiting up to `within_s` (real time)."""
        loop = asyncio.get_running_loop()
        released: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not released.done():
                released.set_result(None)

        def wake() -> None:
            loop.call_soon_threadsafe(settle)

        if not self.tables.when_released(job_id, wake):
            return True
        try:
            await asyncio.wait_for(released, within_s)
        except TimeoutError:
            return False
        return True

    async def enqueue_keyed(self, claim: KeyClaim, job_type: str, job_id: str,
                            build: Build) -> KeyAnswer:
        taken = self.tables.take_key(claim, job_type, job_id)
        if taken.sent:
            topic, record = build(taken)
            self._publish([(topic, record.key, record.payload, record.headers())])
        return taken

    async def result(self, job_id: str, timeout_s: float, *, model: type[BaseModel] | None,
                     kept: Mapping[str, float | None],
                     types: Mapping[str, JobTypePolicy]) -> Any:
        """As `PostgresStores.result`, on the tester's rows and broker: the same waits and
        looks (`await_result`), except that between runs nothing can change, so it answers
        at once."""
        return await await_result(_MemoryResults(self, types), job_id, timeout_s, kept=kept,
                                  model=model)

    async def row(self, job_id: str, wait_s: float) -> StoredResult | None:
        """The job's row, waiting up to `wait_s` (real time) for it while a run goes on."""
        found = self.tables.result_of(job_id)
        if found is not None or not self._running() or wait_s <= 0:
            return found
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        stop = self.tables.on_result(wake)
        deadline = loop.time() + wait_s
        try:
            while found is None and self._running() and loop.time() < deadline:
                woken.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), deadline - loop.time())
                found = self.tables.result_of(job_id)
        finally:
            stop()
        return found

    def idle(self) -> bool:
        return not self._running()

    async def write_plan(self, plan: Plan) -> None:
        _, rows = self.tables.commit(None, plan.statements)
        if rows:
            self._publish(rows)

    async def progress(self, workflow_id: str) -> Progress:
        w = self.tables.workflows.get(workflow_id)
        if w is None:
            raise UnknownWorkflow(f"No batch or chain has the ID {workflow_id!r} in schema "
                                  f"{self.settings.database_schema!r} (or it was pruned).")
        calls = tuple((slot, job_id) for slot, job_id, _, _ in sorted(w.templates, reverse=True)
                      if slot in CALLBACK_SLOTS)
        return Progress(workflow_id, w.kind, w.total, w.succeeded, w.failed, at(w.created_ms),
                        None if w.finished_ms is None else at(w.finished_ms), w.failed_step,
                        w.failure, w.parent_job_id, calls)

    async def status(self, types: Mapping[str, JobTypePolicy], job_id: str, *,
                     job_type: str | None) -> JobLocation:
        """`locate_job` on the tester's rows and broker (every record is scanned)."""
        tables = self.tables
        cancel = tables.cancels.get(job_id)
        if cancel is not None:
            return cancelled_location(job_id, cancel[0], cancel[1], at(cancel[2]))
        by = tables.superseded.get(job_id)
        if by is not None:
            return superseded_location(job_id, by)
        done = tables.done.get(job_id)
        if done is not None and done.attempt != MARKER_ATTEMPT:
            return JobLocation(job_id, "done", done.job_type, done.attempt,
                               at(done.finished_at_ms), result=tables.result_of(job_id))
        chosen = ([get_job_type(types, job_type)] if job_type is not None
                  else [types[name] for name in sorted(types)])
        sightings: list[Sighting] = []
        type_of: dict[str, str] = {}
        scanned = 0
        for policy in chosen:
            for topic, role, name, group in topics_of(self.settings.topic_prefix, policy):
                type_of[topic] = policy.job_type
                for record in self._broker.records(topic):
                    scanned += 1
                    committed = (None if group is None else self._broker.committed(
                        group, TopicPartition(topic, record.partition)))
                    seen = sighting_of(record, job_id, role=role, name=name,
                                       committed=committed)
                    if seen is not None:
                        sightings.append(seen)
        state, last = judge(sightings)
        return JobLocation(job_id, state, type_of[last.topic] if last else None,
                           last.attempt if last else None, None, last, tuple(sightings),
                           scanned, result=tables.result_of(job_id))

    async def close(self) -> None:
        pass


class _MemoryResults:
    """The `ResultSource` of a tester's `MemoryStores`, looking in `types`."""

    def __init__(self, stores: MemoryStores, types: Mapping[str, JobTypePolicy]) -> None:
        self._stores = stores
        self._types = types

    async def row(self, job_id: str, wait_s: float) -> StoredResult | None:
        return await self._stores.row(job_id, wait_s)

    async def locate(self, job_id: str, job_type: str | None) -> JobLocation:
        return await self._stores.status(self._types, job_id, job_type=job_type)

    def idle(self) -> bool:
        return self._stores.idle()


__all__ = ["MemoryCancels", "MemoryKeys", "MemoryStores"]
