"""The table commands in an 80-column terminal, on the real stack (issue 26): every table
line fits, every job ID stands whole on one line, no header is cut; `--wide` adds the
other columns and `--json` is the document it always was.

The unit tests (tests/unit/test_cli_tables.py) render each table from sample rows; this
one runs the commands as an operator does, so the options reach the tables."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env

from .conftest import Declare
from .test_dlq import _fill

CLI = str(Path(sys.executable).with_name("stream-jobs"))
ROOT = Path(__file__).resolve().parents[2]
BOX = tuple("┏┃┡│├└")


async def _run(settings: Settings, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=ROOT, env=settings_env(settings, COLUMNS="80", NO_COLOR="1"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode() + err.decode()
    return out.decode()


def _fits(out: str, job_ids: list[str]) -> None:
    table_lines = [line for line in out.splitlines() if line.startswith(BOX)]
    assert table_lines, out
    assert max(len(line) for line in table_lines) <= 80, out
    assert "…" not in out, out
    for job_id in job_ids:
        assert any(job_id in line for line in out.splitlines()), f"{job_id} cut:\n{out}"


def _headers(out: str) -> set[str]:
    return {cell.strip() for line in out.splitlines() if line.startswith("┃")
            for cell in line.split("┃") if cell.strip()}


async def test_table_commands_fit_80_columns_with_job_ids_whole(settings: Settings,
                                                                declare: Declare) -> None:
    job_type = "terminal.check"
    await declare(job_type, partitions=2)
    ids = await _fill(settings, job_type, 3, reason="a-rather-long-reason-name")

    listed = await _run(settings, "dlq", "list", job_type)
    _fits(listed, ids)
    assert _headers(listed) >= {"job ID", "reason", "error"}
    assert "origin" not in _headers(listed)

    wide = await _run(settings, "dlq", "list", job_type, "--wide")
    assert _headers(wide) >= {"job ID", "reason", "error", "message", "attempt", "requeues",
                              "letters", "failed at", "enqueued at", "origin",
                              "partition/offset"}
    assert "…" not in wide
    assert all(any(job_id in line for line in wide.splitlines()) for job_id in ids)

    document = json.loads(await _run(settings, "dlq", "list", job_type, "--json"))
    assert sorted(row["job_id"] for row in document["rows"]) == sorted(ids)
    assert {"message", "origin", "partition", "offset"} <= set(document["rows"][0])

    _fits(await _run(settings, "dlq", "show", job_type, ids[0]), [ids[0]])
    _fits(await _run(settings, "job", ids[1], "--type", job_type), [ids[1]])
    stats = await _run(settings, "stats", job_type)
    _fits(stats, [])
    assert _headers(stats) >= {"done/s", "retry/s", "dead/s", "workers", "limit"}
    assert "cancel/s" in _headers(await _run(settings, "stats", job_type, "--wide"))
    _fits(await _run(settings, "topics", "list"), [])
