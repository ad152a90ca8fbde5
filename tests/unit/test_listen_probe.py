"""The LISTEN probe (stream_jobs/postgres/listening.py): a connection that does not answer
is terminated and its owner told once; one that answers, or is busy with its owner's
statement, is left alone."""

from __future__ import annotations

import asyncio

import asyncpg

from stream_jobs.postgres.listening import ListenProbe


class FakeConn:
    def __init__(self, answer: str) -> None:
        self.answer = answer  # "yes", "never", "busy"
        self.terminated = False
        self.asked = 0

    def is_closed(self) -> bool:
        return self.terminated

    def terminate(self) -> None:
        self.terminated = True

    async def fetchval(self, sql: str) -> int:
        self.asked += 1
        if self.answer == "never":
            await asyncio.Event().wait()
        if self.answer == "busy":
            raise asyncpg.InterfaceError("cannot perform operation: another operation is "
                                         "in progress")
        return 1


async def _probed(conn: FakeConn, rounds: int) -> list[str]:
    """Probe until `rounds` questions were asked, or the owner was told."""
    lost: list[str] = []
    probe = ListenProbe(conn, lambda: lost.append("lost"), what="test", interval_s=0.001,
                        timeout_s=0.01).start()
    for _ in range(400):
        if conn.asked > rounds or lost:
            break
        await asyncio.sleep(0.005)  # the probe's rounds, at 1 ms apart
    await probe.stop()
    return lost


async def test_a_silent_connection_is_terminated_and_its_owner_told_once() -> None:
    conn = FakeConn("never")
    assert await _probed(conn, 1) == ["lost"]
    assert conn.terminated


async def test_a_connection_that_answers_or_is_busy_is_left_alone() -> None:
    for answer in ("yes", "busy"):
        conn = FakeConn(answer)
        assert await _probed(conn, 5) == []
        assert not conn.terminated
        assert conn.asked >= 5
