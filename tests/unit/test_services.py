"""Services beside the work (stream_jobs.runtime.services): started in order, stopped in
reverse, and a loop's task ended with its service."""

from __future__ import annotations

import asyncio

import pytest

from stream_jobs.runtime.services import Loop, running


class Piece:
    def __init__(self, name: str, log: list[str], *, fails: bool = False) -> None:
        self.name = name
        self.log = log
        self.fails = fails

    async def start(self) -> None:
        if self.fails:
            raise RuntimeError(f"{self.name} cannot start")
        self.log.append(f"start {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")


async def test_services_stop_in_reverse_once_the_block_ends() -> None:
    log: list[str] = []
    async with running([Piece("a", log), Piece("b", log)]):
        log.append("work")
    assert log == ["start a", "start b", "work", "stop b", "stop a"]


async def test_a_start_that_fails_stops_only_those_started_before_it() -> None:
    log: list[str] = []
    with pytest.raises(RuntimeError, match="b cannot start"):
        async with running([Piece("a", log), Piece("b", log, fails=True), Piece("c", log)]):
            log.append("work")
    assert log == ["start a", "stop a"]


async def test_a_loop_runs_after_ready_until_stopped_then_ends() -> None:
    log: list[str] = []
    looping = asyncio.Event()

    async def run() -> None:
        log.append("run")
        looping.set()
        await asyncio.Event().wait()  # until cancelled

    async def ready() -> None:
        log.append("ready")

    async def ended() -> None:
        log.append("ended")

    loop = Loop("beside", run, ready=ready, ended=ended)
    await loop.start()
    await looping.wait()
    await loop.stop()
    assert log == ["ready", "run", "ended"]


async def test_a_loop_stopped_without_a_start_only_ends() -> None:
    ended: list[str] = []

    async def end() -> None:
        ended.append("ended")

    async def run() -> None:
        raise AssertionError("never started")

    await Loop("never", run, ended=end).stop()
    assert ended == ["ended"]
