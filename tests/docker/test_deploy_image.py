"""ops/deploy/Dockerfile's image runs a worker: `stream-jobs worker consumers.demo:app` in a
container, against the test run's stack, does the jobs enqueued from outside it.

The container shares the host's network, so it reaches the stack at the addresses the
tests use (the testcontainers backend publishes its ports on the host), and runs as the
image's own unprivileged user with the image's own topics/ and consumers/.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import asyncpg

from consumers import demo
from stream_jobs.app import App
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.topics import apply
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings
from tests.waiting import until

REPO = Path(__file__).resolve().parents[2]
JOBS = 3


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False,
                          timeout=120)


async def test_the_image_runs_a_worker_that_does_the_jobs(
        deploy_image: str, stream_jobs_settings: Settings, stream_jobs_schema: str) -> None:
    # The type as the image has it: the repository's topics/email.send.toml.
    settings = stream_jobs_settings.model_copy(update={"topics_dir": REPO / "topics"})
    await prepare_schema(settings, demo.SCHEMA)
    await apply(settings, {"email.send": load_job_types(settings.topics_dir)["email.send"]})

    name = f"stream-jobs-worker-{settings.topic_prefix}"
    started = docker(
        "run", "-d", "--name", name, "--network", "host",
        "-e", f"STREAM_JOBS_KAFKA_BOOTSTRAP={settings.kafka_bootstrap}",
        "-e", f"STREAM_JOBS_DATABASE_URL={settings.database_url}",
        "-e", f"STREAM_JOBS_TOPIC_PREFIX={settings.topic_prefix}",
        "-e", f"STREAM_JOBS_DATABASE_SCHEMA={settings.database_schema}",
        deploy_image, "stream-jobs", "worker", "consumers.demo:app", "--type", "email.send")
    assert started.returncode == 0, started.stderr
    try:
        async with App(settings).client() as client:
            ids = {await client.enqueue("email.send", {"to": f"u{i}@example.com",
                                                       "subject": "from the host"})
                   for i in range(JOBS)}

        conn = await asyncpg.connect(settings.database_url, server_settings={
            "search_path": settings.database_schema})
        try:
            async def all_done() -> bool:
                rows = await conn.fetch("SELECT job_id FROM demo_outbox")
                return {row["job_id"] for row in rows} == ids

            await until(all_done, "the containerised worker did every job", within_s=90)
            rows = await conn.fetch("SELECT job_id FROM demo_outbox")
        finally:
            await conn.close()
        assert len(rows) == JOBS  # each effect once
    finally:
        # SIGTERM drains: the worker finishes, commits and says what it counted.
        docker("stop", "-t", "45", name)
        state = docker("inspect", "-f", "{{.State.ExitCode}} {{.Config.User}}", name)
        logs = docker("logs", name)
        docker("rm", "-f", name)
        print(f"the worker container's log:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
    exit_code, user = state.stdout.split()
    assert (exit_code, user) == ("0", "worker"), logs.stdout + logs.stderr
    assert f"succeeded {JOBS}" in logs.stdout + logs.stderr
