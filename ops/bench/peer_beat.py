"""The Celery beat peer of the schedules section (runs in the peers' venv, never ours).

A 1 s beat schedule and a task that appends, when it runs, the name of the beat that
sent it and the time (one `write` to a file opened O_APPEND: no broker round trip).
The bench starts two `celery beat` processes (`BENCH_BEAT_NAME=a` and `b`, each with its
own schedule file and pidfile) beside one worker: beat has no leader election, so two
beats are how a team would run it for failover, and each sends every firing.
"""

from __future__ import annotations

import os
import time

from celery import Celery

from ops.bench.peer_common import QUEUE, REDIS_URL

RUNS_FILE_ENV = "BENCH_RUNS_FILE"
BEAT_NAME_ENV = "BENCH_BEAT_NAME"

app = Celery("bench-beat", broker=REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    accept_content=["json"],
    beat_schedule={"tick": {"task": "bench.tick", "schedule": 1.0,
                            "args": [os.environ.get(BEAT_NAME_ENV, "beat")]}},
)


# celery lives only in the peers' venv, so here mypy knows its decorator as Any.
@app.task(name="bench.tick")  # type: ignore[untyped-decorator]
def tick(beat: str) -> None:
    line = f"{beat} {time.time():.6f}\n".encode()
    fd = os.open(os.environ[RUNS_FILE_ENV], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
