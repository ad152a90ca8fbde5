"""Which tenant starts next: weighted round robin across the tenants with work. Pure.

A worker of a type with `[fairness]` keeps each lane's ready work in a `TenantRotation`
instead of one queue: the work of each tenant in its own queue, and the tenants with
work in a ring. Each turn the tenant at the front of the ring starts up to its weight
(`[fairness] weights`, 1 by default) of its items, then goes to the back, so while k
tenants have work each starts `weight` of every round of `sum(weights)` starts, whatever
their backlog: a tenant with 50,000 jobs waiting takes one turn per round like a tenant
with one. No tenant starves while it has work: it is at most one round away.

A tenant may be held back (`hold`): a per-tenant limit refused its next start. Its
items stay in its queue, out of the ring and out of `len()`, until `release_hold`, so
the other tenants' work goes on and nothing polls. Each operation is O(1), whatever the
number of tenants (deficit round robin over a deque).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class TenantRotation(Generic[T]):
    """A drop-in for a `deque` of ready work (`append`, `popleft`, `len`, truth), served
    round robin by tenant. `tenant_of(item)` names an item's tenant when it is appended;
    `weight_of(tenant)` says how many starts a tenant gets per turn."""

    __slots__ = ("_held", "_queues", "_ready", "_ring", "_tenant_of", "_turn_left",
                 "_weight_of")

    def __init__(self, tenant_of: Callable[[T], str],
                 weight_of: Callable[[str], int] = lambda _: 1) -> None:
        self._tenant_of = tenant_of
        self._weight_of = weight_of
        self._queues: dict[str, deque[T]] = {}
        # Tenants with work that may start, the one whose turn it is first.
        self._ring: deque[str] = deque()
        self._held: set[str] = set()
        self._ready = 0  # items of tenants in the ring
        self._turn_left = 0  # starts left in the front tenant's turn (0: a fresh turn)

    def __len__(self) -> int:
        return self._ready

    def __bool__(self) -> bool:
        return self._ready > 0

    def __iter__(self) -> Iterator[T]:
        for queue in self._queues.values():
            yield from queue

    def append(self, item: T) -> None:
        self._add(item, left=False)

    def appendleft(self, item: T) -> None:
        """Put `item` back in front of its tenant's queue (a start that was refused)."""
        self._add(item, left=True)

    def _add(self, item: T, *, left: bool) -> None:
        tenant = self._tenant_of(item)
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
            if tenant not in self._held:
                self._ring.append(tenant)
        if left:
            queue.appendleft(item)
        else:
            queue.append(item)
        if tenant not in self._held:
            self._ready += 1

    def popleft(self) -> T:
        """The next item in round-robin order; IndexError when none may start."""
        ring = self._ring
        if not ring:
            raise IndexError("pop from an empty rotation")
        tenant = ring[0]
        if self._turn_left <= 0:
            self._turn_left = max(1, self._weight_of(tenant))
        queue = self._queues[tenant]
        item = queue.popleft()
        self._ready -= 1
        self._turn_left -= 1
        if not queue:
            del self._queues[tenant]
            ring.popleft()
            self._turn_left = 0
        elif self._turn_left <= 0:
            ring.rotate(-1)
        return item

    def hold(self, tenant: str) -> None:
        """Keep `tenant`'s items from starting until `release_hold(tenant)`."""
        if tenant in self._held:
            return
        self._held.add(tenant)
        queue = self._queues.get(tenant)
        if queue is not None:
            if self._ring and self._ring[0] == tenant:
                self._turn_left = 0
            self._ring.remove(tenant)
            self._ready -= len(queue)

    def release_hold(self, tenant: str) -> None:
        """Let `tenant`'s items start again (at the back of the ring)."""
        if tenant not in self._held:
            return
        self._held.discard(tenant)
        queue = self._queues.get(tenant)
        if queue is not None:
            self._ring.append(tenant)
            self._ready += len(queue)

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def tenants(self) -> dict[str, int]:
        """Items waiting by tenant (held ones included)."""
        return {tenant: len(queue) for tenant, queue in self._queues.items()}


__all__ = ["TenantRotation"]
