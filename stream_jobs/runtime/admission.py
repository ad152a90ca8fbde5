"""Which jobs may start, and what a finished one gives back: a worker's part in cancels,
unique keys and debounce (docs/control.md).

- **Cancels.** The type's `CancelWatch` keeps the cancelled job IDs in a set; the worker
  and its relay look each job up there before it starts, or before a tier releases or
  hops it: a set lookup, no query, so the no-op path pays nothing measurable. A cancel
  that arrives looks for its job among the worker's runners (each holds the context of
  the job in its handler, `Runner.ctx`: nothing is kept per job) and interrupts it: an async
  handler's task is cancelled (`CancelledError` at its next await), a sync handler sees
  `ctx.cancelled`. A cancel that waits for a run's open `ctx.once()` asks for an
  interrupt first; that run is stopped the same way, and counts `cancelled` once the
  cancel committed (else it failed, and is retried). A run whose `ctx.once()` found its
  dedup row taken asks whether that row is a cancel's (the set, else one query) to count
  it `cancelled`, not `duplicate`.
- **Unique keys.** A job carrying `sj-unique` gives its key back once it finished, with
  any outcome but `retried`.
- **Debounce.** A job carrying `sj-debounce` asks, before it starts, whether a newer job
  of its window superseded it.

Only jobs that carry those headers, or that meet a taken dedup row, cost a query.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from stream_jobs.cancels.rules import ReleasedKey
from stream_jobs.cancels.watch import CancelFeed, OnCancel
from stream_jobs.errors import ConfigError, StreamJobsError
from stream_jobs.record import HEADER_UNIQUE, JobRecord
from stream_jobs.runtime.dispatch import Runner
from stream_jobs.settings import Settings
from stream_jobs.unique.release import Keys, until_done

log = logging.getLogger("stream_jobs.worker")

# After an interrupt, how long a run waits for its cancel to commit (milliseconds, as a
# rule) before it counts as a failed run instead.
CONFIRM_WITHIN_S = 1.0


class Admission:
    """Cancels, unique keys and debounce for one worker of `job_type` (a service of the
    worker's, `stream_jobs.runtime.services`: started before its first fetch)."""

    name = "cancels and keys"

    def __init__(self, settings: Settings, job_type: str, *, interruptible: bool,
                 stopping: asyncio.Event, runners: Callable[[], Iterable[Runner]],
                 cancels: CancelFeed | None, keys: Keys) -> None:
        self.job_type = job_type
        self._stopping = stopping
        self.watch: CancelFeed | None = cancels
        # The watch's own set (it adds to it in place), or one that stays empty.
        self.cancelled: set[str] = cancels.ids if cancels is not None else set()
        # Attempts released early by retry-now (stream_jobs/retry_now/), the watch's too.
        self.released: set[ReleasedKey] = cancels.released if cancels is not None else set()
        # The worker's runners: a job in a handler now is the one whose `ctx` has its ID.
        self._runners = runners
        # A thread cannot be interrupted: a sync handler is told through ctx.cancelled.
        self.interruptible = interruptible
        self.keys = keys
        self.interrupted = 0  # runs stopped by a cancel (or by a cancel's interrupt)
        if cancels is not None:
            cancels.subscribe(self.on_cancel, on_interrupt=self.on_interrupt)

    def subscribe(self, on_cancel: OnCancel, *, on_release: OnCancel | None = None) -> None:
        """Tell `on_cancel` of each cancel too, and `on_release` of each attempt released
        early (the relay wakes a held record with them)."""
        if self.watch is not None:
            self.watch.subscribe(on_cancel)
            if on_release is not None:
                self.watch.subscribe_released(on_release)

    async def start(self) -> None:
        # Loaded while the consumer joins: a job cancelled before the worker started is
        # known before the first fetch (the watch waits a few seconds at most for it).
        if self.watch is not None:
            await self.watch.start()

    async def stop(self) -> None:
        if self.watch is not None:
            await self.watch.stop()
        await self.keys.close()

    def running(self, job_id: str) -> list[Runner]:
        """The runners whose handler runs `job_id` now (a scan of at most `concurrency`
        runners, made only when a cancel arrives)."""
        return [r for r in self._runners() if r.ctx is not None and r.ctx.job_id == job_id]

    def on_cancel(self, job_id: str) -> None:
        """A cancel arrived: interrupt the job if a handler runs it now (a job that is not
        running is finished by the check before it starts)."""
        for runner in self.running(job_id):
            self._stop(runner, "cancelled while running")

    def on_interrupt(self, job_id: str) -> None:
        """A cancel waits for this job's claim: stop the run if it is inside `ctx.once()`
        (a sync handler's block cannot be seen, so a sync run is told in any case)."""
        for runner in self.running(job_id):
            assert runner.ctx is not None
            if not self.interruptible or runner.ctx.in_once:
                self._stop(runner, "asked to stop: a cancel waits for its ctx.once()")

    def _stop(self, runner: Runner, why: str) -> None:
        ctx = runner.ctx
        if ctx is None or not ctx.stop_for_cancel():
            return
        self.interrupted += 1
        log.info("job %s (%s) attempt %d %s", ctx.job_id, ctx.job_type, ctx.attempt, why,
                 extra={"job_id": ctx.job_id, "job_type": ctx.job_type,
                        "attempt": ctx.attempt})
        if self.interruptible and runner.task is not None:
            runner.task.cancel()

    async def confirmed(self, job: JobRecord) -> bool:
        """Whether the cancel that stopped a run of `job` committed (waiting a little for
        it after an interrupt); False means the run failed for nothing, and is retried."""
        if job.job_id in self.cancelled:
            return True
        try:
            if self.watch is not None:
                return await self.watch.confirmed(job.job_id, CONFIRM_WITHIN_S)
        except StreamJobsError as exc:
            log.warning("job %s: cannot tell whether its cancel committed: %s", job.job_id,
                        exc)
        return await self.cancelled_instead(job)

    async def cancelled_instead(self, job: JobRecord) -> bool:
        """Whether a run that found its dedup row taken met a cancel, not an earlier run.
        Without the watch (`cancel_watch=false`) no cancel is known here, and such a run
        counts as a duplicate."""
        if job.job_id in self.cancelled:
            return True
        watch = self.watch
        if watch is None:
            return False
        try:
            return await until_done(lambda: watch.is_cancelled(job.job_id),
                                    self._stopping, f"job {job.job_id}: cannot tell a cancel "
                                    "from an earlier run")
        except ConfigError as exc:  # a schema migrated before cancels existed
            log.warning("job %s: counted a duplicate, cancels cannot be read: %s",
                        job.job_id, exc)
            return False

    async def superseded(self, job: JobRecord) -> bool:
        """Whether a newer job of debounced `job`'s window replaced it."""
        by = await until_done(lambda: self.keys.superseded_by(job.job_id), self._stopping,
                              f"job {job.job_id}: cannot tell whether it was superseded")
        return by is not None

    async def give_back(self, job: JobRecord) -> None:
        """`job` finished: its unique key may be taken by the next enqueue."""
        if job.unique_key is not None:
            await self.keys.release_until_done(job.job_type, job.unique_key, job.job_id,
                                               self._stopping)


def holds_key(headers: Sequence[tuple[str, bytes]]) -> bool:
    """Whether a record carries a unique key (which only a finished run gives back)."""
    return any(name == HEADER_UNIQUE for name, _ in headers)


__all__ = ["Admission", "holds_key"]
