"""History on the real stack: the windows count exactly what the workers counted, across
a kill -9 of the history process, and a job ending past a window's end counts once.

The history's windows are 2 s here (history_window_s) so that many windows pass in a
test. Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.history.process import run_history
from stream_jobs.history.store import HistoryStore
from stream_jobs.history.tally import Tally, total
from stream_jobs.history.windows import window_start
from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env
from tests.integration.served_gateway import serve_env, serving

from .conftest import Declare

pytestmark = pytest.mark.integration

STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
WINDOW_S = 2
POLL_S = 0.1


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(POLL_S)


def _history_settings(app: App, tmp_path: Path) -> Settings:
    return app.settings.model_copy(update={"history_window_s": WINDOW_S,
                                           "history_data_dir": tmp_path / "history"})


def _counted(outcomes: Counter[str]) -> dict[str, int]:
    return {str(k): v for k, v in outcomes.items() if v}


async def _windows(store: HistoryStore, job_type: str, size_s: int) -> Tally:
    return total([row.tally for row in await store.span(job_type, size_s, 0)])


async def _views(store: HistoryStore, job_type: str) -> tuple[dict[str, int], ...]:
    """What the running total, the minute windows and the hour windows say."""
    totals = (await store.totals()).get(job_type, Tally())
    return (totals.outcomes, (await _windows(store, job_type, WINDOW_S)).outcomes,
            (await _windows(store, job_type, WINDOW_S * 60)).outcomes)


async def _all_agree(store: HistoryStore, job_type: str, expected: dict[str, int],
                     timeout_s: float = 90) -> None:
    """Wait until minute windows, hour windows and the running total all say `expected`."""
    deadline = time.monotonic() + timeout_s
    while (seen := await _views(store, job_type)) != (expected, expected, expected):
        if time.monotonic() > deadline:
            raise AssertionError(f"the history says {seen} (total, minutes, hours), "
                                 f"not {expected}")
        await asyncio.sleep(POLL_S)


def _mixed_app(settings: Settings, job_type: str) -> App:
    """Every fifth job fails for good (dead-lettered at once), the others succeed."""
    app = App(settings)

    @app.job(job_type)
    async def mixed(payload: dict[str, Any], ctx: JobContext) -> None:
        if payload["i"] % 5 == 0:
            raise PermanentError("every fifth job fails")

    return app


async def _enqueue(app: App, job_type: str, n: int) -> None:
    async with app.client() as client:
        for start in range(0, n, 500):
            await client.enqueue_many([Job(job_type, {"i": i})
                                       for i in range(start, start + 500)])


async def test_windows_count_exactly_what_the_workers_counted(
        app: App, declare: Declare, tmp_path: Path) -> None:
    settings = _history_settings(app, tmp_path)
    await declare("hist.mixed", max_attempts=1, partitions=3)
    mixed = _mixed_app(settings, "hist.mixed")
    stop = asyncio.Event()
    history = asyncio.create_task(run_history(settings, stop))
    store = HistoryStore(settings)
    try:
        await _enqueue(mixed, "hist.mixed", 5_000)
        workers = [mixed.worker("hist.mixed", report_interval_s=0.3) for _ in range(2)]
        await asyncio.gather(*(w.run(until_idle=True) for w in workers))
        counted: Counter[str] = Counter()
        for worker in workers:
            counted.update(worker.outcomes)
        expected = _counted(counted)
        assert expected == {"succeeded": 4_000, "dead_lettered": 1_000}
        await _all_agree(store, "hist.mixed", expected)
        minutes = await store.span("hist.mixed", WINDOW_S, 0)
        assert all(row.start_ms % (WINDOW_S * 1000) == 0 for row in minutes)
        runs = total([row.tally for row in minutes])
        assert sum(runs.durations) == sum(runs.dwells) == 5_000  # every run timed once
    finally:
        stop.set()
        await history
        await store.close()


def _start_history(settings: Settings, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """A `stream-jobs history` process of `settings`' prefix, with 2 s windows."""
    env = settings_env(settings, STREAM_JOBS_HISTORY_WINDOW_S=str(WINDOW_S),
                       STREAM_JOBS_HISTORY_DATA_DIR=str(settings.history_data_dir))
    return subprocess.Popen([str(STREAM_JOBS), "history"], env=env, stdout=log, stderr=log)


async def test_the_history_killed_mid_stream_and_started_again_still_counts_exactly(
        app: App, declare: Declare, tmp_path: Path) -> None:
    settings = _history_settings(app, tmp_path)
    await declare("hist.killed", max_attempts=1, partitions=3)
    mixed = _mixed_app(settings, "hist.killed")
    log = (tmp_path / "history.log").open("ab")
    start = functools.partial(_start_history, settings, log)
    store = HistoryStore(settings)
    first = start()
    try:
        await _enqueue(mixed, "hist.killed", 2_500)
        # Reports every 50 ms: the history folds many while the worker runs.
        worker = mixed.worker("hist.killed", report_interval_s=0.05)
        running = asyncio.create_task(worker.run())

        async def some_counted() -> bool:
            found = (await store.totals()).get("hist.killed")
            return found is not None and found.finished > 0
        await _until(some_counted, "the first history process to count some jobs")
        # The second half runs while the history dies and is away.
        await _enqueue(mixed, "hist.killed", 2_500)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        partial = (await store.totals())["hist.killed"].finished
        assert partial < 5_000, "the kill came after the last job: nothing was tested"
        second = start()
        try:
            await _until(lambda: _finished(worker, 5_000), "the worker to finish 5,000 jobs")
            expected = _counted(worker.outcomes)
            assert expected == {"succeeded": 4_000, "dead_lettered": 1_000}
            await _all_agree(store, "hist.killed", expected, timeout_s=120)
        finally:
            worker.request_stop()
            await running
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=60) == 0
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
        await store.close()


async def _finished(worker: Any, n: int) -> bool:
    return sum(worker.outcomes.values()) >= n


async def test_a_job_ending_past_a_windows_end_counts_once_in_the_window_it_ended_in(
        app: App, declare: Declare, tmp_path: Path) -> None:
    settings = _history_settings(app, tmp_path)
    await declare("hist.edge", max_attempts=1)
    edge = App(settings)
    ends: list[int] = []

    @edge.job("hist.edge")
    async def across(payload: dict[str, Any], ctx: JobContext) -> None:
        # Start in one window, end in the next: run until the window's end has passed.
        boundary = window_start(int(time.time() * 1000), WINDOW_S) + WINDOW_S * 1000
        # The job's own work: it lasts until just past the boundary.
        await asyncio.sleep((boundary + 100) / 1000 - time.time())
        ends.append(int(time.time() * 1000))

    stop = asyncio.Event()
    history = asyncio.create_task(run_history(settings, stop))
    store = HistoryStore(settings)
    try:
        async with edge.client() as client:
            await client.enqueue("hist.edge", {})
        await edge.worker("hist.edge", report_interval_s=0.2).run(until_idle=True)
        await _all_agree(store, "hist.edge", {"succeeded": 1})
        rows = [row for row in await store.span("hist.edge", WINDOW_S, 0)
                if row.tally.finished]
        assert [(row.start_ms, row.tally.finished) for row in rows] == \
            [(window_start(ends[0], WINDOW_S), 1)]
    finally:
        stop.set()
        await history
        await store.close()


async def test_serve_with_history_keeps_the_history_inside_the_gateway(
        app: App, declare: Declare, tmp_path: Path) -> None:
    settings = _history_settings(app, tmp_path)
    await declare("hist.served", max_attempts=1)
    mixed = _mixed_app(settings, "hist.served")
    env = serve_env(settings, settings.topics_dir, STREAM_JOBS_HISTORY_WINDOW_S=str(WINDOW_S),
                    STREAM_JOBS_HISTORY_DATA_DIR=str(settings.history_data_dir))
    store = HistoryStore(settings)
    try:
        with serving(env, tmp_path / "serve.log", "--no-auth", "--history") as (_, process):
            await _enqueue(mixed, "hist.served", 500)
            worker = mixed.worker("hist.served", report_interval_s=0.3)
            await worker.run(until_idle=True)
            await _all_agree(store, "hist.served", _counted(worker.outcomes))
            process.send_signal(signal.SIGTERM)
            # uvicorn ends by raising the signal it stopped on again: -SIGTERM is its clean end
            assert process.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        await store.close()


async def test_reports_sent_while_the_history_is_down_count_after_its_restart(
        app: App, declare: Declare, tmp_path: Path) -> None:
    # The worker's last reports reach Kafka while no history process runs, and it never
    # reports again: only the restarted history reading them can count its jobs.
    settings = _history_settings(app, tmp_path)
    await declare("hist.down", max_attempts=1, partitions=3)
    mixed = _mixed_app(settings, "hist.down")
    log = (tmp_path / "history.log").open("ab")
    start = functools.partial(_start_history, settings, log)
    store = HistoryStore(settings)
    first = start()
    second: subprocess.Popen[bytes] | None = None
    try:
        await _enqueue(mixed, "hist.down", 1_000)
        worker = mixed.worker("hist.down", report_interval_s=0.05)
        running = asyncio.create_task(worker.run())
        await _until(lambda: _finished(worker, 1_000), "the worker to finish 1,000 jobs")

        async def all_counted() -> bool:
            found = (await store.totals()).get("hist.down")
            return found is not None and found.finished >= 1_000
        await _until(all_counted, "the first history process to count them")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        # Its replacement starts at once, as a supervisor would start it: it joins the
        # group only once the dead process's session has run out (10 s).
        second = start()
        await _enqueue(mixed, "hist.down", 1_000)
        await _until(lambda: _finished(worker, 2_000), "the worker to finish 2,000 jobs")
        worker.request_stop()
        await running  # its last report, the final one, goes out meanwhile
        expected = _counted(worker.outcomes)
        await _all_agree(store, "hist.down", expected, timeout_s=120)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
        log.close()
        await store.close()
