"""Where everything that is not in Kafka is kept: one `Storage` per `App` (as its
`KafkaClients`), which makes what the runtime and the clients need of the database.

`PostgresStorage` is the real one: each worker gets its own dedup store (its pool, its
group commit) and key store, the finish store rides on the dedup store's connections,
every worker of the process shares one cancel watch (one `LISTEN` connection, a feed per
type), and each client gets its stores, opened on first use. A `JobTester` puts its
in-memory one in the app's place (`stream_jobs.testing.memory_storage`), so a test swaps
one object, not five.

Whoever asks for a store closes it when done (`close()`); the cancel feed is started and
stopped by its worker instead, and the watch closes its connection when the last feed
stops.
"""

from __future__ import annotations

from typing import Protocol

from stream_jobs.cancels.watch import CancelFeed, CancelWatch
from stream_jobs.client_stores import ClientStores, PostgresStores
from stream_jobs.dedup.store import Dedup, DedupStore
from stream_jobs.fairness.gate import TenantGate
from stream_jobs.results.finish import FinishStore
from stream_jobs.results.store import FinishRows
from stream_jobs.settings import Settings
from stream_jobs.tenants import FairnessSpec
from stream_jobs.unique.release import Keys, KeyStore


class Storage(Protocol):
    """What the runtime and the clients ask of the database."""

    def dedup_store(self) -> Dedup:
        """A worker's dedup store (`ctx.once()`), closed by the worker."""
        ...

    def finish_store(self, dedup: Dedup) -> FinishStore | None:
        """What a job with a result, a batch or a chain commits its end through, on
        `dedup`'s connections; None where results cannot be kept."""
        ...

    def cancel_feed(self, job_type: str) -> CancelFeed | None:
        """The type's cancels (None: `cancel_watch` is off), started and stopped by the
        worker."""
        ...

    def key_store(self) -> Keys:
        """Unique keys given back and debounce windows asked, closed by the worker."""
        ...

    def client_stores(self) -> ClientStores:
        """A client's cancels, keys, results and workflows, closed by the client."""
        ...

    def tenant_gate(self, job_type: str, spec: FairnessSpec, holder: str
                    ) -> TenantGate | None:
        """A fair worker's per-tenant limits across the fleet (None: not kept here),
        started and stopped by the worker."""
        ...


class PostgresStorage:
    """The stores on the settings' Postgres (see the module)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._watch: CancelWatch | None = None

    def dedup_store(self) -> DedupStore:
        return DedupStore(self.settings)

    def finish_store(self, dedup: Dedup) -> FinishStore | None:
        return FinishRows(dedup) if isinstance(dedup, DedupStore) else None

    def cancel_feed(self, job_type: str) -> CancelFeed | None:
        if not self.settings.cancel_watch:
            return None
        if self._watch is None:
            # The watch's store is its own: closed with its connection, after the last feed.
            self._watch = CancelWatch(self.settings)
        return self._watch.feed(job_type)

    def key_store(self) -> KeyStore:
        return KeyStore(self.settings)

    def client_stores(self) -> ClientStores:
        return PostgresStores(self.settings)

    def tenant_gate(self, job_type: str, spec: FairnessSpec, holder: str) -> TenantGate:
        return TenantGate(self.settings, job_type, spec, holder)


__all__ = ["PostgresStorage", "Storage"]
