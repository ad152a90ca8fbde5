"""What a scenario is: a name, what it does, its fault script and the stack it needs.
The process-fault scenarios are in `scenarios.py`, the network ones in
`net_scenarios.py`."""

from __future__ import annotations

from dataclasses import dataclass

from ops.chaos.trial import Inject


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    method: str
    inject: Inject
    cluster: bool = False
    workers: int = 3
    fail_fraction: float = 0.0
    handler_timeout_s: float = 30.0
    # Spread the enqueue over this many seconds (the faults then hit producing as well).
    enqueue_over_s: float | None = None
    # The goal beyond "0 lost, 0 duplicate effects": also 0 duplicate deliveries.
    no_redelivery: bool = False
    # Run with Toxiproxy between the workers and the broker and Postgres (`Stack.net`).
    network: bool = False
    # The worker's peak RSS may be at most this many times the net-baseline run's.
    rss_goal: float | None = None

    @property
    def description(self) -> str:
        """The method, and how the jobs arrive when they are spread out."""
        if self.enqueue_over_s is None:
            return self.method
        return (f"{self.method} Jobs are enqueued throughout (spread over "
                f"{self.enqueue_over_s:.0f} s).")


__all__ = ["Scenario"]
