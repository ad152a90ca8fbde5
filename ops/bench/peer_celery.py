"""The Celery peer: a no-op task on Redis (runs in the peers' venv).

Settings, from Celery's "Optimizing" guide for many short tasks: a large prefetch
multiplier (128), results ignored (no result backend), rate limits off, early acks
(acks_late off, the default), the default broker connection pool. The bench starts the
worker with `celery -A ops.bench.peer_celery worker --pool <pool> --concurrency <n>`.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from ops.bench.peer_common import QUEUE, REDIS_URL, enqueue_main, tally

app = Celery("bench", broker=REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    task_acks_late=False,
    worker_prefetch_multiplier=128,
    worker_disable_rate_limits=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    accept_content=["json"],
)


# celery lives only in the peers' venv, so here mypy knows its decorator as Any.
@app.task(name="bench.noop")  # type: ignore[untyped-decorator]
def noop(job: dict[str, Any]) -> None:
    tally()


if __name__ == "__main__":
    enqueue_main("Celery", noop.delay)
