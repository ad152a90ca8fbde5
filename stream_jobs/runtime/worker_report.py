"""What a worker publishes to `P._stats` every few seconds: its counters now.

Read from the worker when the report is made (its runners, its held records), so that
the per-job path pays nothing for it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from stream_jobs.clock import now_ms
from stream_jobs.fairness.tally import TenantDwell, section_of
from stream_jobs.runtime.reports import WorkerReport
from stream_jobs.runtime.running_jobs import held_headers, in_handlers, process_fields

if TYPE_CHECKING:
    from stream_jobs.runtime.worker import Worker


def report_of(worker: Worker, *, final: bool = False) -> WorkerReport:
    """`worker`'s counters now (`final`: its last report, as it stops)."""
    # What runs: the runners' calls, read here so that the per-job path pays nothing.
    runners = worker.dispatcher.runners  # none unless a loop runs this worker
    running, running_count = in_handlers(
        runners, timeout_s=worker.handler.timeout_s, now_ms=now_ms(),
        loop_now_s=asyncio.get_running_loop().time() if runners else 0.0)
    return WorkerReport(
        job_type=worker.policy.job_type, worker_id=worker.worker_id, at_ms=now_ms(),
        started_at_ms=worker.started_at_ms,
        outcomes={str(k): v for k, v in worker.outcomes.items()},
        dead_letter_reasons={str(k): v for k, v in worker.dead_letter_reasons.items()},
        in_flight=worker.in_flight(),
        released=worker.relay.released if worker.relay is not None else 0, final=final,
        interval_s=worker.report_interval_s, rate_limit_per_s=worker.rate.per_s,
        rate_source=worker.rate.source, rate_share_per_s=worker.rate_share_per_s,
        heartbeats=tuple((tp.topic, tp.partition, at_ms)
                         for tp, at_ms in sorted(worker.heartbeats.items())),
        slot_ms=worker.slots.slot_ms,
        slots={start: tally.to_obj() for start, tally in worker.slots.slots(now_ms()).items()},
        partitions=tuple(sorted((tp.topic, tp.partition) for tp in worker.partitions)),
        running=running, running_count=running_count, **process_fields(),
        tenants=section_of(worker.tenant_dwell or TenantDwell(),
                           held_headers(worker.partitions.values())).to_obj())


__all__ = ["report_of"]
