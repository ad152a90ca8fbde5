"""One worker process for many types: which types run, what it prints, how the host
starts, stops and fails its workers and services. No services: the runners are fakes."""

from __future__ import annotations

import asyncio
import io
import logging
import multiprocessing
import os
from typing import Any

import pytest

from stream_jobs.errors import BrokerUnavailable, ConfigError
from stream_jobs.logs import JsonFormatter, TextFormatter
from stream_jobs.runtime.host import WorkerHost, add_counts, select_types, summary
from stream_jobs.runtime.supervisor import child_name, processes_of
from tests.waiting import until


def test_without_type_every_type_with_a_handler_runs() -> None:
    assert select_types({"b.two", "a.one"}, []) == ["a.one", "b.two"]
    assert select_types({"b.two", "a.one"}, ["b.two", "b.two"]) == ["b.two"]


def test_a_named_type_needs_a_handler_except_in_shadow_mode() -> None:
    with pytest.raises(ConfigError, match=r"no handler for 'c\.three' \(it has: a\.one\)"):
        select_types({"a.one"}, ["a.one", "c.three"])
    assert select_types({"a.one"}, ["c.three"], shadow=True) == ["c.three"]
    with pytest.raises(ConfigError, match="no handlers: register one"):
        select_types(set(), [])


def test_the_stopped_line_names_the_types_when_there_are_several() -> None:
    one = {"mail.send": {"succeeded": 2, "retried": 1, "expired": 0}}
    assert summary(one) == "retried 1, succeeded 2"
    assert summary({"mail.send": {}}) == "no jobs"
    two = {"mail.send": {"succeeded": 2}, "img.resize": {}}
    assert summary(two) == "img.resize: no jobs; mail.send: succeeded 2"
    assert summary({"mail.send": {"valid": 5, "undecodable": 0}},
                   shadow=True) == "5 valid, 0 undecodable"


def test_children_counts_add_up() -> None:
    total: dict[str, dict[str, int]] = {}
    add_counts(total, {"a": {"succeeded": 2}})
    add_counts(total, {"a": {"succeeded": 3, "retried": 1}, "b": {"duplicate": 1}})
    assert total == {"a": {"succeeded": 5, "retried": 1}, "b": {"duplicate": 1}}


def test_processes_are_a_number_or_auto() -> None:
    assert processes_of("1", 8) == 1
    assert processes_of(" 3 ", 8) == 3
    assert processes_of("AUTO", 8) == 8
    assert processes_of("auto", 0) == 1
    for bad in ("0", "-2", "two", "1.5", ""):
        with pytest.raises(ConfigError, match=r"--processes .* 1 or more, or auto"):
            processes_of(bad, 8)


def test_a_child_names_itself_in_text_and_json_lines() -> None:
    assert child_name(2) == "worker-2"
    record = logging.LogRecord("stream_jobs.worker", logging.INFO, __file__, 1, "hello", (),
                               None)
    assert "process=" not in TextFormatter().format(record)  # MainProcess: nothing added
    record.processName = child_name(2)
    assert TextFormatter().format(record).endswith("hello process=worker-2")
    assert '"process":"worker-2"' in JsonFormatter().format(record)
    assert multiprocessing.current_process().name == "MainProcess"


# -- the host, with fake runners ----------------------------------------------------------


class FakeRunner:
    """What the host needs of a Worker: run until stopped, request_stop, and what the
    idle watch reads (`stream_jobs.runtime.idle.Drainable`): it has `jobs` to take in,
    one a poll, each finished at once."""

    def __init__(self, job_type: str, events: list[str], *, fail: Exception | None = None,
                 jobs: int = 0) -> None:
        self.job_type = job_type
        self.group_id = f"p.{job_type}.worker"
        self.events = events
        self.fail = fail
        self.jobs = jobs
        self.taken = 0
        self.stopping = asyncio.Event()
        self.empty_poll = asyncio.Event()

    def request_stop(self) -> None:
        self.stopping.set()

    def busy(self) -> bool:
        return False

    def intake(self) -> int:
        return self.taken

    async def drained(self) -> bool:
        return self.taken == self.jobs

    async def run(self) -> None:
        self.events.append(f"{self.job_type} started")
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        while not self.stopping.is_set():
            if self.taken < self.jobs:
                self.taken += 1
            else:
                self.empty_poll.set()
            await asyncio.sleep(0)  # a poll
        self.events.append(f"{self.job_type} drained")


class FakeService:
    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.events = events

    async def start(self) -> None:
        self.events.append(f"{self.name} up")

    async def stop(self) -> None:
        self.events.append(f"{self.name} down")


def host(*runners: FakeRunner, **options: Any) -> WorkerHost:
    return WorkerHost(runners, **options)  # type: ignore[arg-type]


async def test_services_start_before_the_workers_and_stop_after_them() -> None:
    events: list[str] = []
    a, b = FakeRunner("a", events, jobs=3), FakeRunner("b", events, jobs=5)
    h = host(a, b, until_idle=True,
             services=[FakeService("metrics", events), FakeService("outbox", events)])
    await asyncio.wait_for(h.run(), 5)
    assert (a.taken, b.taken) == (3, 5)
    assert events[:2] == ["metrics up", "outbox up"]
    assert events[-2:] == ["outbox down", "metrics down"]
    assert sorted(events[2:-2]) == ["a drained", "a started", "b drained", "b started"]


async def test_a_stop_drains_every_type() -> None:
    events: list[str] = []
    h = host(FakeRunner("a", events), FakeRunner("b", events))
    task = asyncio.create_task(h.run())
    await until(lambda: len(events) == 2, "both types started")
    assert not task.done()
    h.request_stop()
    await asyncio.wait_for(task, 5)
    assert {"a drained", "b drained"} <= set(events)


async def test_one_type_failing_drains_the_others_and_raises_its_error(
        caplog: pytest.LogCaptureFixture) -> None:
    events: list[str] = []
    error = BrokerUnavailable("No Kafka broker answered.")
    h = host(FakeRunner("a", events), FakeRunner("b", events, fail=error),
             services=[FakeService("metrics", events)])
    with pytest.raises(BrokerUnavailable):
        await asyncio.wait_for(h.run(), 5)
    assert "a drained" in events  # the healthy type was drained, not abandoned
    assert events[-1] == "metrics down"
    assert "b stopped with an error, so the other types of this process drain" in caplog.text


async def test_the_supervisor_gone_drains_the_process() -> None:
    events: list[str] = []
    read_end, write_end = os.pipe()
    try:
        h = host(FakeRunner("a", events), lifeline=read_end)
        task = asyncio.create_task(h.run())
        await until(lambda: bool(events), "the type started")
        assert not task.done()
        os.close(write_end)  # what the kernel does when the supervisor dies
        write_end = -1
        await asyncio.wait_for(task, 5)
        assert events == ["a started", "a drained"]
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_a_host_needs_a_type() -> None:
    with pytest.raises(ConfigError, match="at least one job type"):
        WorkerHost([])


def test_configure_writes_the_child_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from stream_jobs import logs

    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    logs.configure(stream=out)
    monkeypatch.setattr(multiprocessing.current_process(), "name", "worker-3")
    try:
        logging.getLogger("stream_jobs.test").info("child line")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert "child line process=worker-3" in out.getvalue()
