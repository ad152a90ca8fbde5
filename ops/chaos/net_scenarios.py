"""The network scenarios: Toxiproxy (`netproxy.py`) between the workers and the stack's
broker (its FRONT listener advertises the proxy, so every connection a worker makes to
Kafka passes it) and between the workers and Postgres (two links: the pools', and the
LISTEN connections'). The runner's own clients, samplers and checks go direct, so a
fault hits the workers only. Each fault is healed, then the run drains and is judged
like every other scenario (lost, duplicate effects, commits past unfinished work,
recovery time), and the workers' peak RSS is kept beside it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ops.chaos.netproxy import Fronted, Link
from ops.chaos.scenario import Scenario
from ops.chaos.trial import Inject, Trial


def _net(trial: Trial) -> Fronted:
    net = trial.stack.net
    if net is None:
        raise RuntimeError(f"{trial.scenario} needs the network stack (Stack.net)")
    return net


def _links(trial: Trial, part: str) -> list[Link]:
    net = _net(trial)
    return list(net.brokers) if part == "kafka" else [net.postgres, net.listen]


async def _on_all(links: list[Link], act: Callable[[Link], Awaitable[None]]) -> None:
    await asyncio.gather(*(act(link) for link in links))


def hold(part: str, fault: str, for_s: float, **attributes: int) -> Inject:
    """`fault` (a `Link` method: latency, blackhole, bandwidth) on every link of `part`
    for `for_s`, then healed."""

    async def inject(trial: Trial) -> None:
        links = _links(trial, part)
        started = time.time()
        await _on_all(links, lambda link: getattr(link, fault)(**attributes))
        try:
            await asyncio.sleep(for_s)  # the fault's length, not a wait for a condition
        finally:
            await _on_all(links, Link.clear)
        detail = ", ".join(f"{k} {v}" for k, v in attributes.items())
        trial.fault(f"{part} {fault}", started,
                    detail=f"{for_s:.0f} s" + (f" ({detail})" if detail else ""))

    return inject


def resets(part: str, for_s: float = 30.0, every_s: float = 3.0, rst_s: float = 0.3) -> Inject:
    """Every connection of `part`'s links reset (RST) every `every_s` for `for_s`: the
    reset toxic stays `rst_s`, so connections made in that moment are reset too."""

    async def inject(trial: Trial) -> None:
        links = _links(trial, part)
        began = time.monotonic()
        while time.monotonic() - began < for_s:
            started = time.time()
            await _on_all(links, Link.reset_connections)
            await asyncio.sleep(rst_s)  # the reset's length
            await _on_all(links, Link.clear)
            trial.fault(f"{part} reset", started)
            await asyncio.sleep(max(0.0, every_s - rst_s))  # the pace of the resets

    return inject


def _no_fault() -> Inject:
    async def inject(trial: Trial) -> None:
        return None

    return inject


NET_SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("net-baseline", "through the proxies, no fault",
             "3 workers whose Kafka and Postgres connections all pass Toxiproxy, no fault: "
             "what the network scenarios' throughput, recovery and memory compare with.",
             _no_fault(), network=True, enqueue_over_s=20.0),
    Scenario("net-kafka-latency", "200 ms ± 100 ms on every broker link for 30 s",
             "Toxiproxy adds 200 ms ± 100 ms to every answer from the broker (fetches, "
             "commits, produces of retries, heartbeats) for 30 s.",
             hold("kafka", "latency", 30.0, ms=200, jitter_ms=100), network=True,
             enqueue_over_s=40.0),
    Scenario("net-pg-latency", "200 ms ± 100 ms on the Postgres links for 30 s",
             "Toxiproxy adds 200 ms ± 100 ms to every answer from Postgres (claims, "
             "effects, commits, the cancel watch) for 30 s.",
             hold("postgres", "latency", 30.0, ms=200, jitter_ms=100), network=True,
             enqueue_over_s=40.0),
    Scenario("net-kafka-blackhole", "the broker link blackholed for 20 s",
             "Every byte between the workers and the broker goes nowhere for 20 s, "
             "with no RST (new connections are accepted and hear nothing); then the link "
             "returns (Toxiproxy closes the connections it dropped bytes of).",
             hold("kafka", "blackhole", 20.0), network=True, enqueue_over_s=40.0),
    Scenario("net-pg-blackhole", "Postgres hangs for 20 s",
             "Every byte between the workers and Postgres goes nowhere for 20 s, with no "
             "RST: a Postgres that hangs. Handlers inside `ctx.once()` must end at their "
             "timeout (10 s here), and no offset may be committed past work whose dedup "
             "row is not durable.", hold("postgres", "blackhole", 20.0), network=True,
             handler_timeout_s=10.0, enqueue_over_s=40.0),
    Scenario("net-kafka-resets", "broker connections reset every 3 s for 30 s",
             "Every connection between the workers and the broker is reset (RST) every "
             "3 s for 30 s.", resets("kafka"), network=True, enqueue_over_s=40.0),
    Scenario("net-pg-resets", "Postgres connections reset every 3 s for 30 s",
             "Every connection between the workers and Postgres is reset (RST) every 3 s "
             "for 30 s, mid-transaction or not.", resets("postgres"), network=True,
             enqueue_over_s=40.0),
    Scenario("net-kafka-bandwidth", "broker links squeezed to 64 KB/s for 20 s",
             "The broker's answers to the workers pass at 64 KB/s for 20 s while jobs keep "
             "arriving: a backlog builds; the workers' peak RSS must stay within 1.2x the "
             "net-baseline run's.", hold("kafka", "bandwidth", 20.0, kb_per_s=64),
             network=True, enqueue_over_s=40.0, rss_goal=1.2),
)}

__all__ = ["NET_SCENARIOS", "hold", "resets"]
