"""A `JobTester`'s `Storage` (`stream_jobs.storage`): the in-memory dedup store and
tables in the app's place while the tester runs, so its workers and clients keep their
rows in memory behind the same seam the real ones use."""

from __future__ import annotations

from stream_jobs.cancels.watch import CancelFeed
from stream_jobs.client_stores import ClientStores
from stream_jobs.dedup.store import Dedup
from stream_jobs.results.finish import FinishStore
from stream_jobs.tenants import FairnessSpec
from stream_jobs.testing.memory_control import MemoryCancels, MemoryKeys, MemoryStores
from stream_jobs.testing.memory_dedup import MemoryDedup
from stream_jobs.unique.release import Keys


class MemoryStorage:
    """The tester's rows: one dedup store for every worker (its `close` does nothing),
    a cancel feed and a key store over its tables, and its clients' stores."""

    def __init__(self, dedup: MemoryDedup, stores: MemoryStores) -> None:
        self.dedup = dedup
        self.stores = stores

    def dedup_store(self) -> Dedup:
        return self.dedup

    def finish_store(self, dedup: Dedup) -> FinishStore | None:
        return dedup if isinstance(dedup, FinishStore) else None

    def cancel_feed(self, job_type: str) -> CancelFeed | None:
        return MemoryCancels(self.dedup.tables, job_type)

    def key_store(self) -> Keys:
        return MemoryKeys(self.dedup.tables)

    def client_stores(self) -> ClientStores:
        return self.stores

    def tenant_gate(self, job_type: str, spec: FairnessSpec, holder: str) -> None:
        """The tester runs fair dispatch and the overflow lane, not the per-tenant limits
        across the fleet, which are Postgres's (docs/testing.md)."""
        return None


__all__ = ["MemoryStorage"]
