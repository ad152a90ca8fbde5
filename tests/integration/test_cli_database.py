"""The CLI and the database: `db migrate` readies a schema that does not exist yet, and a
command pointed at a database that cannot be used says so in one sentence, never in a
traceback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from stream_jobs.postgres.migrate import migrate
from stream_jobs.postgres.schema import SCHEMA_OBJECTS
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import drop_schema
from tests.integration.cli_env import settings_env

from .conftest import Declare
from .test_operator_cli import CLI, ROOT

JOB_ID = "01a2265a-9f17-7019-a966-4a00c51fb752"


async def _run(settings: Settings, *args: str, timeout_s: float = 120
               ) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=ROOT, env=settings_env(settings, COLUMNS="200"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _with(url: str, *, user: str | None = None, port: int | None = None,
          database: str | None = None) -> str:
    """`url` with another user, port or database."""
    parts = urlsplit(url)
    host = f"{parts.hostname}:{port or parts.port}"
    netloc = f"{user or parts.username}@{host}"
    path = f"/{database}" if database is not None else parts.path
    return urlunsplit(parts._replace(netloc=netloc, path=path))


async def _objects(settings: Settings) -> set[str]:
    """The tables and sequences in the settings' schema (an identity column's too)."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        rows = await conn.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = $1 AND c.relkind IN ('r', 'S')", settings.database_schema)
    finally:
        await conn.close()
    return {row[0] for row in rows}


@pytest.fixture
async def missing_schema(settings: Settings) -> AsyncIterator[str]:
    """The test's schema name, which does not exist yet; dropped afterwards."""
    yield settings.database_schema
    await drop_schema(settings)


async def test_migrate_creates_a_missing_schema_then_finds_it_up_to_date(
        settings: Settings, missing_schema: str) -> None:
    code, _, err = await _run(settings, "db", "migrate")
    assert code == 0, err
    assert "Traceback" not in err
    assert f"created schema {missing_schema} and in it stream_jobs_done" in err, err
    assert set(SCHEMA_OBJECTS) <= await _objects(settings)

    # Run again: nothing is missing. With one table gone, only it is created.
    code, _, err = await _run(settings, "db", "migrate")
    assert code == 0, err
    assert f"schema {missing_schema} is up to date ({len(SCHEMA_OBJECTS)} tables" in err, err
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'DROP TABLE "{missing_schema}".stream_jobs_unique')
    finally:
        await conn.close()
    code, _, err = await _run(settings, "db", "migrate")
    assert code == 0, err
    assert (f"schema {missing_schema}: created stream_jobs_unique; "
            f"{len(SCHEMA_OBJECTS) - 1} others were there already") in err, err
    assert set(SCHEMA_OBJECTS) <= await _objects(settings)


async def test_concurrent_migrations_of_one_schema_all_succeed(
        settings: Settings, missing_schema: str) -> None:
    done = await asyncio.gather(*(migrate(settings) for _ in range(4)))
    assert sorted(m.schema_created for m in done) == [False, False, False, True]
    assert sorted(len(m.created) for m in done) == [0, 0, 0, len(SCHEMA_OBJECTS)]


@pytest.fixture
async def unprivileged(settings: Settings) -> AsyncIterator[str]:
    """A login role that may create nothing (no CREATE on the database nor on public)."""
    role = f"{settings.topic_prefix}_user"
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'CREATE ROLE "{role}" LOGIN')
        yield role
    finally:
        await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        await conn.close()


async def test_migrate_without_the_privilege_says_what_its_owner_can_run(
        settings: Settings, missing_schema: str, unprivileged: str) -> None:
    as_role = settings.model_copy(update={
        "database_url": _with(settings.database_url, user=unprivileged)})
    code, out, err = await _run(as_role, "db", "migrate")
    lines = err.strip().splitlines()
    assert (code, out, len(lines)) == (1, "", 1), err
    assert f"user '{unprivileged}' may not create schemas" in lines[0]
    assert f"CREATE SCHEMA {missing_schema} AUTHORIZATION {unprivileged}" in lines[0]

    in_public = as_role.model_copy(update={"database_schema": "public"})
    code, out, err = await _run(in_public, "db", "migrate")
    lines = err.strip().splitlines()
    assert (code, out, len(lines)) == (1, "", 1), err
    assert f"GRANT CREATE ON SCHEMA public TO {unprivileged}" in lines[0]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listening: connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.mark.parametrize("refusal", ["closed port", "unknown database", "unknown user"])
async def test_commands_on_a_database_that_refuses_say_so_in_one_sentence(
        settings: Settings, declare: Declare, closed_port: int, refusal: str) -> None:
    await declare("real.type", partitions=1)
    url = {"closed port": _with(settings.database_url, port=closed_port),
           "unknown database": _with(settings.database_url, database="no_such_database"),
           "unknown user": _with(settings.database_url, user="no_such_user")}[refusal]
    refused = settings.model_copy(update={"database_url": url})
    demo = refused.model_copy(update={"topics_dir": ROOT / "topics"})
    commands: list[tuple[Settings, list[str]]] = [
        (refused, ["db", "migrate"]),
        (refused, ["db", "prune", "--older-than", "30d"]),
        (refused, ["outbox", "status"]),
        (refused, ["schedules", "list"]),
        (refused, ["schedules", "pause", "nightly"]),
        (refused, ["schedules", "trigger", "nightly"]),
        (refused, ["batch", JOB_ID]),
        (refused, ["cancel", "real.type", JOB_ID]),
        (refused, ["enqueue", "real.type", "{}", "--unique-key", "once"]),
        (demo, ["demo", "--no-start-stack"]),
    ]
    gate = asyncio.Semaphore(4)  # each CLI start costs a second of CPU on a shared machine

    async def attempt(on: Settings, args: list[str]) -> tuple[int, str, str]:
        async with gate:
            return await _run(on, *args)

    answers = await asyncio.gather(*(attempt(on, args) for on, args in commands))
    wrong = []
    for (_, args), (code, out, err) in zip(commands, answers, strict=True):
        lines = err.strip().splitlines()
        if (code != 1 or "Traceback" in out + err or len(lines) != 1
                or not lines[0].startswith("error: ") or "STREAM_JOBS_DATABASE_URL" not in err):
            wrong.append(f"{' '.join(args)} -> exit {code}, stdout {out!r}, stderr {err!r}")
    assert not wrong, "\n".join(wrong)
