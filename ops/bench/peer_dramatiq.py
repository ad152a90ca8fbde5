"""The Dramatiq peer: a no-op actor on its RedisBroker (runs in the peers' venv).

Default middleware, no result backend, retries off for the no-op. The bench starts the
worker with `dramatiq ops.bench.peer_dramatiq --processes 2 --threads 8`, Dramatiq's
defaults on this box (one process per core, eight threads each).
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from ops.bench.peer_common import QUEUE, REDIS_URL, enqueue_main, tally

broker = RedisBroker(url=REDIS_URL)
dramatiq.set_broker(broker)


# dramatiq lives only in the peers' venv, so here mypy knows its decorator as Any.
@dramatiq.actor(queue_name=QUEUE, max_retries=0)  # type: ignore[untyped-decorator]
def noop(job: dict[str, Any]) -> None:
    tally()


if __name__ == "__main__":
    enqueue_main("Dramatiq", noop.send)
