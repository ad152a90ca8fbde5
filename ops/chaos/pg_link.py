"""The workers' Postgres link cut, for the trials' runs in the runner's network stage
(`<name>@net`, `Stack.net` set: the workers reach Postgres and the broker through
Toxiproxy, `Stack.worker_env`, while the runner's own clients and checks go direct): the
link of the workers' pools and the one of their LISTEN connections are blackholed for
`BLACKHOLE_S` (bytes go nowhere, no RST: a Postgres that hangs), healed, and a little
later every connection on them is reset (RST) once. `PgLinkCut.after` is a hook for
`paced.kill_per_share` (after one of its worker kills); `PgLinkCut.now` cuts at once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ops.chaos.netproxy import Fronted, Link

log = logging.getLogger("ops.chaos.pg_link")
BLACKHOLE_S = 10.0
SETTLE_S = 2.0  # between the blackhole's end and the resets
RESET_S = 0.3  # how long the reset toxic stays (connections made meanwhile reset too)


def cut_point(kills: int) -> int:
    """After which of a run's `kills` worker kills (from 1) the link is cut: the first
    one after the middle (after which `paced.kill_per_share` restarts Postgres), or the
    last."""
    if kills < 1:
        raise ValueError("a run with no worker kills has no point to cut the link at")
    return min(kills, (kills + 1) // 2 + 1)


@dataclass
class PgLinkCut:
    """Blackhole and then reset the workers' Postgres links once; nothing off the network
    stage (`net` None). `cuts`: how many times it was done."""

    net: Fronted | None
    point: int = 0  # the worker kill `after` cuts after (0: none)
    cuts: int = 0

    @property
    def lasts_s(self) -> float:
        """How long a cut lasts (0 off the network stage)."""
        return 0.0 if self.net is None else BLACKHOLE_S + SETTLE_S + RESET_S

    @property
    def links(self) -> list[Link]:
        return [] if self.net is None else [self.net.postgres, self.net.listen]

    async def after(self, k: int) -> None:
        if k == self.point:
            await self.now()

    async def now(self) -> None:
        if self.net is None:
            return
        log.info("the workers' Postgres links blackholed for %.0f s", BLACKHOLE_S)
        await asyncio.gather(*(link.blackhole() for link in self.links))
        try:
            await asyncio.sleep(BLACKHOLE_S)  # the fault's length
        finally:
            await asyncio.gather(*(link.clear() for link in self.links))
        await asyncio.sleep(SETTLE_S)  # the workers reconnect before the resets
        log.info("every connection of the workers' Postgres links reset")
        await asyncio.gather(*(link.reset_connections() for link in self.links))
        try:
            await asyncio.sleep(RESET_S)  # the reset's length
        finally:
            await asyncio.gather(*(link.clear() for link in self.links))
        self.cuts += 1
