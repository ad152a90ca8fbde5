"""`make compose-check`: docker-compose.yml, run for real.

    python -m ops.docker.compose_check

Brings up Kafka, Postgres, the one-shot setup, the demo worker and the history process
with the repository's compose file, waits for the worker's health check, enqueues
email.send jobs from the host through the published Kafka port, sees every job's effect
row in the published Postgres, then the history's running total of email.send count
exactly those jobs (its windows in stream_jobs_history), and tears everything down
(volumes included), whatever happened. It proves the file's wiring: the listeners the
host and the containers use, the health checks, the start-up order (setup only after a
healthy stack, the worker and the history only after setup), and a broker that allows
the history's transactions.

The images must exist (ops/docker/images.py; no `--build` here, so nothing is pulled).
The stack is published on STREAM_JOBS_COMPOSE_KAFKA_PORT / STREAM_JOBS_COMPOSE_POSTGRES_PORT,
39092 and 39432 unless set, so it runs beside a `stream-jobs dev up` on 9092 / 54320;
STREAM_JOBS_COMPOSE_PROJECT names the compose project (stream-jobs-compose-check), so two
checkouts can run it at once on other ports.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from stream_jobs.app import App
from stream_jobs.errors import StreamJobsError
from stream_jobs.settings import Settings
from stream_jobs.stack.process import ensure_port_free

REPO = Path(__file__).resolve().parents[2]
PROJECT = os.environ.get("STREAM_JOBS_COMPOSE_PROJECT", "stream-jobs-compose-check")
KAFKA_PORT_ENV = "STREAM_JOBS_COMPOSE_KAFKA_PORT"
POSTGRES_PORT_ENV = "STREAM_JOBS_COMPOSE_POSTGRES_PORT"
JOBS = 20
HEALTHY_WITHIN_S = 300.0
DONE_WITHIN_S = 120.0
# The worker reports every 5 s; the history joins its group and writes within seconds.
COUNTED_WITHIN_S = 120.0


class CheckFailed(Exception):
    """The compose stack did not come up, or did not do the jobs."""


def compose(*args: str, env: dict[str, str], timeout_s: float = 600) -> str:
    if shutil.which("docker-compose") is None:
        raise CheckFailed("docker-compose is not installed: ops/docker/engine.sh installs "
                          "Debian's (apt-get install docker-compose).")
    argv = ["docker-compose", "-p", PROJECT, "-f", str(REPO / "docker-compose.yml"), *args]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                            timeout=timeout_s)
    if result.returncode != 0:
        raise CheckFailed(f"docker-compose {' '.join(args)} failed: "
                          f"{(result.stderr or result.stdout).strip()[-800:]}")
    return result.stdout


def inspect(container: str, template: str) -> str:
    out = subprocess.run(["docker", "inspect", "-f", template, container], capture_output=True,
                         text=True, check=False)
    return out.stdout.strip()


async def poll(check: Callable[[], Awaitable[bool]], what: str, within_s: float) -> float:
    """Seconds until `check` holds; CheckFailed naming `what` at the deadline."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > within_s:
            raise CheckFailed(f"not within {within_s:.0f} s: {what}")
        await asyncio.sleep(0.5)
    return time.monotonic() - start


async def run_check(env: dict[str, str], kafka_port: int, postgres_port: int) -> dict[str, float]:
    timings: dict[str, float] = {}
    start = time.monotonic()
    compose("up", "-d", "--no-build", "worker", "history", env=env)
    timings["up"] = time.monotonic() - start
    worker = compose("ps", "-q", "worker", env=env).strip()
    setup = compose("ps", "-a", "-q", "setup", env=env).strip()
    if not worker:
        raise CheckFailed("docker-compose up started no worker container.")

    async def healthy() -> bool:
        status = inspect(worker, "{{.State.Health.Status}}")
        if status == "unhealthy" or inspect(worker, "{{.State.Status}}") == "exited":
            raise CheckFailed(f"the worker is {status or 'gone'}: "
                              + compose("logs", "--tail", "20", "worker", env=env))
        return status == "healthy"

    timings["healthy"] = await poll(healthy, "the worker's health check passes",
                                    HEALTHY_WITHIN_S)
    # The worker may only have started after setup made the topics and tables.
    if setup and inspect(setup, "{{.State.ExitCode}}") != "0":
        raise CheckFailed("the setup service did not succeed, yet the worker started.")

    settings = Settings(kafka_bootstrap=f"127.0.0.1:{kafka_port}",
                        database_url=f"postgresql://stream_jobs@127.0.0.1:{postgres_port}/"
                                     "stream_jobs",
                        topics_dir=REPO / "topics")
    sent = time.monotonic()
    async with App(settings).client() as client:
        ids = {await client.enqueue("email.send", {"to": f"user{i}@example.com",
                                                   "subject": "compose check"})
               for i in range(JOBS)}
    conn = await asyncpg.connect(settings.database_url)
    try:
        async def done() -> bool:
            try:
                rows = await conn.fetch(
                    "SELECT job_id FROM demo_outbox WHERE job_id = ANY($1)", list(ids))
            except asyncpg.UndefinedTableError as exc:
                raise CheckFailed("the demo's effect table demo_outbox does not exist: the "
                                  "setup service did not make it (python -m consumers.demo)."
                                  ) from exc
            return len(rows) == len(ids)

        await poll(done, f"the worker did all {JOBS} jobs (demo_outbox rows)", DONE_WITHIN_S)
        timings["jobs done"] = time.monotonic() - sent
        copies = await conn.fetchval(
            "SELECT count(*) FROM demo_outbox WHERE job_id = ANY($1)", list(ids))
        if copies != JOBS:
            raise CheckFailed(f"{copies} effect rows for {JOBS} jobs: an effect happened twice.")
        timings["history counted"] = await history_counted(conn, env) - sent
    finally:
        await conn.close()
    return timings


async def history_counted(conn: asyncpg.Connection, env: dict[str, str]) -> float:
    """When the history's running total of email.send came to the jobs enqueued (the
    worker did nothing else on these fresh volumes); CheckFailed if it crashed, restarted
    or counted otherwise."""
    history = compose("ps", "-q", "history", env=env).strip()
    if not history:
        raise CheckFailed("docker-compose up started no history container.")
    seen: dict[str, int] = {}

    async def counted() -> bool:
        if inspect(history, "{{.RestartCount}}") not in ("", "0") \
                or inspect(history, "{{.State.Status}}") != "running":
            raise CheckFailed("the history process stopped: "
                              + compose("logs", "--tail", "20", "history", env=env))
        raw = await conn.fetchval("SELECT tally::text FROM stream_jobs_history WHERE "
                                  "job_type = 'email.send' AND size_s = 0 AND start_ms = 0")
        seen.clear()
        seen.update(json.loads(raw)["outcomes"] if raw else {})
        if seen.get("succeeded", 0) > JOBS:
            raise CheckFailed(f"the history counted {seen} for {JOBS} jobs done once each.")
        return seen == {"succeeded": JOBS}

    try:
        await poll(counted, f"the history's total of email.send is {JOBS} done",
                   COUNTED_WITHIN_S)
    except CheckFailed as exc:
        raise CheckFailed(f"{exc} (it counts {seen or 'nothing yet'})") from exc
    return time.monotonic()


def main() -> int:
    kafka_port = int(os.environ.get(KAFKA_PORT_ENV, "39092"))
    postgres_port = int(os.environ.get(POSTGRES_PORT_ENV, "39432"))
    env = {**os.environ, KAFKA_PORT_ENV: str(kafka_port), POSTGRES_PORT_ENV: str(postgres_port)}
    begin = time.monotonic()
    timings: dict[str, float] = {}
    failure: str | None = None
    try:
        ensure_port_free("127.0.0.1", kafka_port, "The compose check's Kafka", KAFKA_PORT_ENV)
        ensure_port_free("127.0.0.1", postgres_port, "The compose check's Postgres",
                         POSTGRES_PORT_ENV)
        timings = asyncio.run(run_check(env, kafka_port, postgres_port))
    except (CheckFailed, StreamJobsError, subprocess.TimeoutExpired, asyncpg.PostgresError,
            OSError) as exc:
        failure = str(exc)
    finally:
        down = time.monotonic()
        try:
            compose("down", "-v", "--remove-orphans", "-t", "45", env=env)
        except CheckFailed as exc:
            failure = failure or str(exc)
        timings["down"] = time.monotonic() - down
    shown = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
    if failure is not None:
        print(f"compose check failed: {failure}", file=sys.stderr)
        return 1
    print(f"compose check passed: {JOBS} jobs enqueued from the host, each done once by "
          f"the compose worker and counted once by its history ({shown}; "
          f"{time.monotonic() - begin:.1f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
