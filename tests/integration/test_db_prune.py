"""`stream-jobs db prune` against the real Postgres: old rows go in batches, new rows stay,
a dry run deletes nothing, and a cutoff inside the lanes' retention is refused."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import asyncpg
import pytest

from stream_jobs.cli import app
from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import ConfigError
from stream_jobs.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))


def _env(settings: Settings) -> dict[str, str]:
    return {"STREAM_JOBS_DATABASE_URL": settings.database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": settings.database_schema,
            "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir)}


async def test_prune_deletes_old_rows_in_batches(settings: Settings, schema: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = DedupStore(settings)
    await store.migrate()
    conn = await asyncpg.connect(settings.database_url, server_settings={"search_path": schema})
    try:
        rows = [(f"old-{i}", 8 + i % 5) for i in range(25)] + [(f"new-{i}", 0) for i in range(5)]
        await conn.executemany(
            "INSERT INTO stream_jobs_done (job_id, job_type, attempt, finished_at) "
            "VALUES ($1, 't', 1, now() - make_interval(days => $2))", rows)
        (settings.topics_dir / "t.toml").write_text('retention = "7d"\n')

        _, matched, deleted = await store.prune(7 * 86_400, dry_run=True)
        assert (matched, deleted) == (25, 0)
        assert await conn.fetchval("SELECT count(*) FROM stream_jobs_done") == 30

        # Refused before any I/O: those jobs are still inside the lanes' retention.
        for name, value in _env(settings).items():
            monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError, match=r"inside the 7d retention of 't'.*--force"):
            app(args=["db", "prune", "--older-than", "2d"], standalone_mode=False)
        assert await conn.fetchval("SELECT count(*) FROM stream_jobs_done") == 30

        proc = await asyncio.create_subprocess_exec(
            CLI, "db", "prune", "--older-than", "7d", "--batch", "7", cwd=ROOT,
            env={**os.environ, **_env(settings), "COLUMNS": "200"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        assert "deleted 25 dedup rows" in out.decode()
        left = await conn.fetch("SELECT job_id FROM stream_jobs_done")
        assert sorted(r["job_id"] for r in left) == sorted(f"new-{i}" for i in range(5))

        assert (await store.prune(7 * 86_400))[1:] == (0, 0)  # running again is safe
    finally:
        await conn.close()
        await store.close()


async def test_prune_takes_expired_results_and_old_finished_workflows(
        settings: Settings, schema: str) -> None:
    store = DedupStore(settings)
    await store.migrate()
    conn = await asyncpg.connect(settings.database_url, server_settings={"search_path": schema})
    try:
        await conn.executemany(
            "INSERT INTO stream_jobs_results (job_id, job_type, state, attempt, expires_at) "
            "VALUES ($1, 't', 'succeeded', 1, now() + make_interval(hours => $2))",
            [(f"r-{i}", -1 if i < 6 else 1) for i in range(10)])
        await conn.executemany(
            "INSERT INTO stream_jobs_workflows (workflow_id, kind, total, finished_at) "
            "VALUES ($1, 'batch', 1, now() - make_interval(days => $2))",
            [("old", 9), ("recent", 1)])
        await conn.execute("INSERT INTO stream_jobs_workflows (workflow_id, kind, total) "
                           "VALUES ('open', 'batch', 1)")
        await conn.execute(
            "INSERT INTO stream_jobs_workflow_jobs (workflow_id, slot, job_id, job_type, topic, "
            "value, headers) VALUES ('old', 'on_complete', 'c', 't', 'x', '{}', '[]')")
        (settings.topics_dir / "t.toml").write_text('retention = "7d"\n')
        proc = await asyncio.create_subprocess_exec(
            CLI, "db", "prune", "--older-than", "7d", "--batch", "4", cwd=ROOT,
            env={**os.environ, **_env(settings), "COLUMNS": "200"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        assert "deleted 6 kept results past their keep_result and 1 batch or chain" \
            in out.decode()
        left = await conn.fetch("SELECT job_id FROM stream_jobs_results ORDER BY job_id")
        assert [r["job_id"] for r in left] == [f"r-{i}" for i in range(6, 10)]
        kept = await conn.fetch("SELECT workflow_id FROM stream_jobs_workflows ORDER BY 1")
        assert [r["workflow_id"] for r in kept] == ["open", "recent"]
        assert await conn.fetchval("SELECT count(*) FROM stream_jobs_workflow_jobs") == 0
    finally:
        await conn.close()
        await store.close()
