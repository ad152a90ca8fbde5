"""One leader per job type: a Postgres advisory lock held on a dedicated connection.

Every scheduler of a type waits for the same session-level advisory lock
(`pg_advisory_lock`, keyed by schema, prefix and type); the one holding it is the leader.
The lock lives as long as the session, so the ways a leader stops leading are the ways
its session ends, and each is bounded:

- it exits or is killed (SIGKILL included): the kernel closes its socket and Postgres
  releases the lock at once; a waiting scheduler has it within milliseconds;
- it is paused (SIGSTOP, a VM frozen) or its host drops off the network: its session
  goes idle, and Postgres ends it after the lease (`idle_session_timeout`, and
  `idle_in_transaction_session_timeout` if it stopped inside a firing's transaction),
  TCP keepalives covering a host that vanished; a live leader touches its session every
  quarter lease, so only a stuck one reaches it;
- Postgres restarts or the connection breaks: the leader's next statement fails and it
  steps down, then waits for the lock again on a new connection.

A paused leader that wakes after another took over may still enqueue the firing it was
working on; that firing's job ID is the one the new leader used, so the dedup table runs
it once. Its state writes only move forward (`state.record`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from datetime import datetime
from typing import Any

from stream_jobs.errors import DatabaseUnavailable, LeadershipLost
from stream_jobs.schedules import state
from stream_jobs.settings import Settings

# Seconds between TCP keepalive probes of a leader's session (server side), and how many
# unanswered ones end it: a host that vanished is noticed within about 5 + 2 x 3 s.
_KEEPALIVE_IDLE_S = 5
_KEEPALIVE_INTERVAL_S = 2
_KEEPALIVE_COUNT = 3
# How often a waiting session checks that its client is still there (Postgres 14+).
_CLIENT_CHECK_MS = 1000


def lock_key(schema: str, prefix: str, job_type: str) -> int:
    """The advisory lock of a type's schedules: a signed 64-bit key from a hash. Advisory
    locks are database-wide, so the schema is part of it as well as the prefix."""
    digest = hashlib.sha256("\0".join(("stream-jobs scheduler", schema, prefix, job_type))
                            .encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_ids(key: int) -> tuple[int, int]:
    """(classid, objid): how `pg_locks` shows a bigint advisory key (high and low 32 bits)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def holder_name(role: str = "scheduler") -> str:
    """This process as `pg_stat_activity.application_name` shows it (at most 63 bytes)."""
    return f"stream-jobs {role} {socket.gethostname()[:30]} pid {os.getpid()}"


class Leadership:
    """The lock of one type on a connection of its own; `acquire` waits for it."""

    def __init__(self, settings: Settings, job_type: str, *, lease_s: float,
                 holder: str | None = None) -> None:
        self.settings = settings
        self.job_type = job_type
        self.lease_s = lease_s
        self.holder = holder or holder_name()
        self.key = lock_key(settings.database_schema, settings.topic_prefix, job_type)
        self._conn: Any = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    @property
    def connection(self) -> Any:
        """The leader's session (asyncpg): state transactions run on it too, so each one
        also proves the lock is still ours."""
        if self._conn is None:
            raise LeadershipLost(f"not the leader of {self.job_type}'s schedules")
        return self._conn

    async def acquire(self) -> None:
        """Wait until this process holds the lock (blocking in Postgres: it is granted the
        moment the holder's session ends). Raises DatabaseUnavailable if the server
        cannot be reached or drops the connection meanwhile."""
        lease_ms = str(round(self.lease_s * 1000))
        conn = await state.connect(self.settings, application_name=self.holder,
                                   server_settings={
                                       "idle_session_timeout": lease_ms,
                                       "idle_in_transaction_session_timeout": lease_ms,
                                       "tcp_keepalives_idle": str(_KEEPALIVE_IDLE_S),
                                       "tcp_keepalives_interval": str(_KEEPALIVE_INTERVAL_S),
                                       "tcp_keepalives_count": str(_KEEPALIVE_COUNT),
                                       "client_connection_check_interval":
                                           str(_CLIENT_CHECK_MS),
                                       "statement_timeout": "0", "lock_timeout": "0"})
        try:
            async with state.guarded(self.settings):
                await conn.execute("SELECT pg_advisory_lock($1)", self.key)
        except BaseException:
            conn.terminate()  # cancelled or failed: the wait ends with the session
            raise
        self._conn = conn

    async def confirm(self) -> None:
        """Touch the session (so an idle leader is not taken for a stuck one) and prove it
        alive; LeadershipLost if it is not."""
        try:
            async with state.guarded(self.settings):
                await asyncio.wait_for(self.connection.fetchval("SELECT 1"),
                                       timeout=self.lease_s / 2)
        except DatabaseUnavailable as exc:
            await self.resign()
            raise LeadershipLost(f"lost the lock of {self.job_type}'s schedules: "
                                 f"{type(exc).__name__}: {exc}") from exc

    async def resign(self) -> None:
        """End the session, which releases the lock (safe to call when not held)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # terminate(), not close(): close() would wait on a server that may be gone.
            conn.terminate()


async def leaders(settings: Settings, job_types: list[str]) -> dict[str, str]:
    """Type -> the application name of the session holding its lock now (absent: no
    leader). Read from `pg_locks`, so it is the lock itself, not a note about it."""
    return {t: name for t, (name, _) in (await leader_sessions(settings, job_types)).items()}


async def leader_sessions(settings: Settings, job_types: list[str]
                          ) -> dict[str, tuple[str, datetime | None]]:
    """Type -> (the leader's application name, when its session last changed state). A
    live leader touches its session every quarter lease, so that time plus the lease is
    when Postgres would end a leader that stopped (`idle_session_timeout`)."""
    wanted = {lock_ids(lock_key(settings.database_schema, settings.topic_prefix, t)): t
              for t in job_types}
    if not wanted:
        return {}
    async with state.session(settings, "stream-jobs schedules") as conn:
        rows = await conn.fetch(
            "SELECT l.classid::bigint AS classid, l.objid::bigint AS objid, "
            "a.application_name, a.state_change FROM pg_locks l JOIN pg_stat_activity a "
            "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND "
            "l.objsubid = 1 AND "
            "l.database = (SELECT oid FROM pg_database WHERE datname = current_database())")
    found: dict[str, tuple[str, datetime | None]] = {}
    for row in rows:
        job_type = wanted.get((int(row["classid"]), int(row["objid"])))
        if job_type is not None:
            found[job_type] = (str(row["application_name"]) or "(unnamed session)",
                               row["state_change"])
    return found
