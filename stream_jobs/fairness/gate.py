"""The worker's hook for per-tenant limits across the fleet: `TenantGate`.

The dispatcher asks `acquire(tenant)` before it starts a job of a limited tenant and calls
`release(tenant)` when the job ended, whatever its outcome. A refused ask returns the
seconds after which asking again is worth it, so a tenant held back waits without a busy
loop and without holding up other tenants' jobs. The gate is a service: `start` opens its
pool and its loop, which renews this holder's slots every `renew_interval_s(ttl)` and
reads the operators' rates every `OVERRIDE_REFRESH_S`; `stop` frees every slot it holds.

Postgres not answering fails closed: an ask is refused (and logged), since a limit that
holds only while the database answers is no limit; a release that fails is left to the
lease, which lapses after the TTL.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections import defaultdict

from stream_jobs.errors import StreamJobsError
from stream_jobs.fairness.limit_store import LimitStore
from stream_jobs.fairness.limits import (
    LEASE_TTL_S,
    MAX_BACKOFF_S,
    OVERRIDE_REFRESH_S,
    full_backoff_s,
    renew_interval_s,
)
from stream_jobs.settings import Settings
from stream_jobs.tenants import FairnessSpec

log = logging.getLogger("stream_jobs.fairness")


class TenantGate:
    """Per-tenant concurrency and rate limits of one type, shared by every process that
    runs it through Postgres (`limit_store`). One gate per type per worker; `holder` names
    this worker in the slots it takes (with a suffix of the gate's own)."""

    name = "tenant limits"

    def __init__(self, settings: Settings, job_type: str, spec: FairnessSpec, holder: str,
                 *, lease_ttl_s: float = LEASE_TTL_S, store: LimitStore | None = None
                 ) -> None:
        self.job_type = job_type
        self.spec = spec
        self.holder = holder
        # What the slots name: this gate alone, so a worker restarted under the same name
        # never renews (and so keeps) the slots its killed predecessor left to lapse.
        self._lease_holder = f"{holder} {secrets.token_hex(4)}"
        self.lease_ttl_s = lease_ttl_s
        self._renew_every_s = renew_interval_s(lease_ttl_s)
        self._store = store or LimitStore(settings)
        self._overrides: dict[str, float | None] = {}
        self._prepared: set[str] = set()
        self._slots: defaultdict[str, list[int]] = defaultdict(list)  # held, by tenant
        self._unslotted: defaultdict[str, int] = defaultdict(int)  # granted, no slot needed
        self._refusals: defaultdict[str, int] = defaultdict(int)  # in a row, by tenant
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._store.open()
        await self._refresh_overrides()
        self._task = asyncio.create_task(self._loop(), name=f"{self.name} {self.job_type}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            await self._store.release_all(self.job_type, self._lease_holder)
        except StreamJobsError as exc:
            log.warning("%s: could not free this worker's tenant slots (they lapse within "
                        "%g s): %s", self.job_type, self.lease_ttl_s, exc)
        finally:
            self._slots.clear()
            await self._store.close()

    def limited(self, tenant: str) -> bool:
        """Whether `tenant` has a concurrency or rate limit now (TOML or operator)."""
        return self.spec.concurrency_of(tenant) is not None or self.rate_of(tenant) is not None

    def rate_of(self, tenant: str) -> float | None:
        """The rate `tenant` runs under as this gate last read it (None: none)."""
        if tenant in self._overrides:
            return self._overrides[tenant]
        return self.spec.rate_of(tenant)

    def held(self, tenant: str) -> int:
        """The slots this gate holds for `tenant` (its running jobs there)."""
        return len(self._slots.get(tenant, ()))

    async def acquire(self, tenant: str) -> float | None:
        """None: `tenant`'s job may start (a slot, and a token if rated, are taken). Else
        the seconds after which asking again is worth it (never 0)."""
        concurrency = self.spec.concurrency_of(tenant)
        if not self.limited(tenant):
            self._unslotted[tenant] += 1
            return None
        if concurrency is not None and self.held(tenant) >= concurrency:
            return self._refused(tenant)  # this worker alone fills the tenant: no question
        try:
            if tenant not in self._prepared:
                await self._store.prepare(self.job_type, tenant, concurrency)
                self._prepared.add(tenant)
            answer = await self._store.acquire(
                self.job_type, tenant, holder=self._lease_holder, concurrency=concurrency,
                toml_rate_per_s=self.spec.rate_of(tenant), lease_s=self.lease_ttl_s)
        except StreamJobsError as exc:
            log.warning("%s: tenant %r waits, its limits cannot be read: %s", self.job_type,
                        tenant, exc)
            return MAX_BACKOFF_S
        if not answer.granted:
            self._refusals[tenant] += 1
            return answer.wait_s(self._refusals[tenant], random.uniform(0.5, 1.0))
        self._refusals.pop(tenant, None)
        if answer.slot is None:
            self._unslotted[tenant] += 1
        else:
            self._slots[tenant].append(answer.slot)
        return None

    async def release(self, tenant: str) -> None:
        """The job of a granted `acquire(tenant)` ended (any outcome): free its slot."""
        if self._unslotted.get(tenant):
            self._unslotted[tenant] -= 1
            if not self._unslotted[tenant]:
                del self._unslotted[tenant]
            return
        slots = self._slots.get(tenant)
        if not slots:
            log.warning("%s: a release of tenant %r without an acquire", self.job_type, tenant)
            return
        slot = slots.pop()
        if not slots:
            del self._slots[tenant]
        try:
            await self._store.release(self.job_type, tenant, slot, self._lease_holder)
        except StreamJobsError as exc:
            log.warning("%s: tenant %r's slot %d stays taken until its lease lapses "
                        "(%g s): %s", self.job_type, tenant, slot, self.lease_ttl_s, exc)

    def _refused(self, tenant: str) -> float:
        self._refusals[tenant] += 1
        return full_backoff_s(self._refusals[tenant], random.uniform(0.5, 1.0))

    async def _loop(self) -> None:
        tick_s = min(OVERRIDE_REFRESH_S, self._renew_every_s)
        ticks_per_renewal = max(1, int(self._renew_every_s // tick_s))
        ticks = 0
        while True:
            await asyncio.sleep(tick_s)  # the period, not a wait for a condition
            ticks += 1
            try:
                if ticks % ticks_per_renewal == 0 and self._slots:
                    # A slot that lapsed meanwhile and went to another holder is not
                    # renewed, and its release frees nothing (both ask for the holder).
                    await self._store.renew(self.job_type, self._lease_holder, self.lease_ttl_s)
                await self._refresh_overrides()
            except StreamJobsError as exc:
                # Asked again next period; a lease outlives RENEWALS_PER_TTL - 1 misses.
                log.warning("%s: tenant limits: %s", self.job_type, exc)

    async def _refresh_overrides(self) -> None:
        self._overrides = await self._store.overrides(self.job_type)

__all__ = ["TenantGate"]
