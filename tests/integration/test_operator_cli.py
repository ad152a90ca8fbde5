"""The CLI as an operator meets it: the demo end to end, and one-sentence errors."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from stream_jobs.settings import Settings

from .conftest import Declare

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))


def _env(settings: Settings) -> dict[str, str]:
    return {**os.environ,
            "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "STREAM_JOBS_DATABASE_URL": settings.database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": settings.database_schema,
            "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
            "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir),
            "COLUMNS": "120"}


async def _run(settings: Settings, *args: str, timeout_s: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=ROOT, env=_env(settings), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_demo_ends_with_every_effect_once_and_matching_stats(settings: Settings) -> None:
    demo = settings.model_copy(update={"topics_dir": ROOT / "topics"})
    code, out, err = await _run(demo, "demo", "--no-start-stack", timeout_s=240)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "every effect happened exactly once" in out
    assert "stats match" in out


@pytest.mark.parametrize("args", [
    ["stats", "nope.type"],
    ["enqueue", "nope.type", "{}"],
    ["dlq", "list", "nope.type"],
    ["dlq", "requeue", "nope.type", "--all"],
    ["dlq", "purge", "nope.type", "--yes"],
    ["job", "01a2265a-9f17-7019-a966-4a00c51fb752", "--type", "nope.type"],
    ["worker", "consumers.demo:app", "--type", "nope.type"],
    ["replay", "PREFIX.nope.type", "--partition", "0", "--from-offset", "0"],
    ["replay", "PREFIX.real.type", "--partition", "0", "--from-offset", "999"],
    ["replay", "PREFIX.real.type", "--from-time", "yesterday-ish"],
    ["dlq", "list", "real.type", "--since", "last tuesday"],
    ["offsets", "reset", "PREFIX.real.type.worker", "--to-offset", "-5"],
    ["throttle", "nope.type", "5/s"],
    ["drain", "real.type", "--rate", "fast"],
])
async def test_mistakes_get_one_sentence_and_a_nonzero_exit(
        settings: Settings, declare: Declare, args: list[str]) -> None:
    await declare("real.type", partitions=1)
    args = [a.replace("PREFIX", settings.topic_prefix) for a in args]
    code, out, err = await _run(settings, *args)
    assert code != 0, out
    assert "Traceback" not in err + out
    errors = [line for line in err.splitlines() if line.startswith(("error:", "Error:"))]
    assert len(errors) == 1, err
