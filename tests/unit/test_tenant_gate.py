"""`TenantGate` without Postgres (a store that records its questions): an unlimited tenant
passes without a question, a tenant this worker alone fills is refused without one, a
refusal always names a wait above zero, and a store that does not answer holds the
tenant back (the limits fail closed)."""

from __future__ import annotations

from typing import Any

from stream_jobs.errors import DatabaseUnavailable
from stream_jobs.fairness.gate import TenantGate
from stream_jobs.fairness.limits import MAX_BACKOFF_S, Answer
from stream_jobs.settings import Settings
from stream_jobs.tenants import FairnessSpec, TenantLimits


class Store:
    """Grants slots 0, 1, ... up to `free`, then refuses; records every question."""

    def __init__(self, free: int = 100, *, down: bool = False) -> None:
        self.free = free
        self.down = down
        self.asked: list[tuple[str, ...]] = []
        self.overriding: dict[str, float | None] = {}

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def prepare(self, job_type: str, tenant: str, concurrency: int | None) -> None:
        self.asked.append(("prepare", tenant))

    async def acquire(self, job_type: str, tenant: str, **_: Any) -> Answer:
        self.asked.append(("acquire", tenant))
        if self.down:
            raise DatabaseUnavailable("Postgres did not answer.")
        if self.free:
            self.free -= 1
            return Answer(True, self.free, True, 1.0, None)
        return Answer(False, None, False, 1.0, None)

    async def release(self, job_type: str, tenant: str, slot: int, holder: str) -> None:
        self.asked.append(("release", tenant))
        self.free += 1

    async def release_all(self, job_type: str, holder: str) -> int:
        self.asked.append(("release_all", holder))
        return 0

    async def overrides(self, job_type: str) -> dict[str, float | None]:
        return dict(self.overriding)


def _gate(store: Store, spec: FairnessSpec) -> TenantGate:
    return TenantGate(Settings(), "report.build", spec, "worker-1", store=store)  # type: ignore[arg-type]


async def test_a_tenant_without_limits_passes_without_a_question() -> None:
    store = Store()
    gate = _gate(store, FairnessSpec(tenants=(("acme", TenantLimits(concurrency=2)),)))
    assert not gate.limited("other")
    assert await gate.acquire("other") is None
    await gate.release("other")
    assert store.asked == []
    assert gate.limited("acme")


async def test_a_tenant_this_worker_fills_is_refused_without_a_question() -> None:
    store = Store()
    gate = _gate(store, FairnessSpec(tenant_concurrency=2))
    assert await gate.acquire("acme") is None
    assert await gate.acquire("acme") is None
    asked = len(store.asked)
    wait_s = await gate.acquire("acme")
    assert wait_s is not None
    assert wait_s > 0
    assert len(store.asked) == asked
    await gate.release("acme")
    assert gate.held("acme") == 1
    assert await gate.acquire("acme") is None


async def test_refusals_back_off_and_a_grant_starts_the_backoff_over() -> None:
    store = Store(free=0)
    gate = _gate(store, FairnessSpec(tenant_concurrency=5))
    waits = [await gate.acquire("acme") for _ in range(8)]
    assert all(w is not None and 0 < w <= MAX_BACKOFF_S for w in waits), waits
    assert waits[-1] > waits[0]  # type: ignore[operator]
    store.free = 1
    assert await gate.acquire("acme") is None
    store.free = 0
    first = await gate.acquire("acme")
    assert first is not None
    assert first < waits[-1]  # type: ignore[operator]


async def test_a_store_that_does_not_answer_holds_the_tenant_back() -> None:
    gate = _gate(Store(down=True), FairnessSpec(tenant_rate_per_s=5.0))
    assert await gate.acquire("acme") == MAX_BACKOFF_S


async def test_an_operators_rate_limits_a_tenant_the_toml_does_not() -> None:
    store = Store()
    gate = _gate(store, FairnessSpec())
    store.overriding = {"beta": 5.0, "gamma": None}
    await gate.start()
    try:
        assert gate.limited("beta")
        assert gate.rate_of("beta") == 5.0
        assert not gate.limited("gamma")  # a lifted rate and no concurrency: no limit
    finally:
        await gate.stop()
    freed = [holder for what, holder in store.asked if what == "release_all"]
    assert len(freed) == 1
    assert freed[0].startswith("worker-1 ")
