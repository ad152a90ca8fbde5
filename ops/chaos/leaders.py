"""Leader kills on the 3-node cluster for the trials whose features write to Kafka
(batches, results, fairness, the outbox relay, unique keys): when the runner runs such a
trial in its cluster stage (`Stack.cluster` set, the trial named `<name>@cluster` in
RESULTS.md), the trial declares its topics with replication 3 (`staged.replication`) and,
after
some of its paced worker kills, kills -9 the broker leading partition 0 of one of its
topics, keeps it down a few seconds, starts it again and waits until every partition of
its topics is back in sync (`LeaderKills.after`, a hook for `paced.kill_per_share`), as
the `leader-kill` scenario does for the plain jobs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ops.chaos import faults
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster

log = logging.getLogger("ops.chaos.leaders")
TIMES = 2  # leader kills in a run
DOWN_S = 5.0  # how long the killed broker stays down
IN_SYNC_WITHIN_S = 120.0
REPLICAS = 3


def leader_kill_points(kills: int, times: int = TIMES) -> frozenset[int]:
    """After which of a run's `kills` worker kills (numbered from 1) a leader is killed:
    `times` of them, spread evenly, none of them the middle one (after which
    `paced.kill_per_share` restarts Postgres) unless there is no other."""
    if kills < 1 or times < 1:
        return frozenset()
    middle = (kills + 1) // 2
    free = [k for k in range(1, kills + 1) if k != middle] or [middle]
    wanted = [round(i * (kills + 1) / (times + 1)) for i in range(1, times + 1)]
    points: set[int] = set()
    for target in wanted:
        left = [k for k in free if k not in points]
        if not left:
            break
        points.add(min(left, key=lambda k: (abs(k - target), k)))
    return frozenset(points)


@dataclass
class LeaderKills:
    """kill -9 the leader of `topic`'s partition 0 after the worker kills in `points`;
    does nothing off the cluster. `nodes`: the brokers killed, in order."""

    settings: Settings
    cluster: KafkaCluster | None
    topic: str
    topics: Sequence[str]  # every topic that must be back in sync after a kill
    points: frozenset[int]
    nodes: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, cluster: KafkaCluster | None, settings: Settings, topic: str,
           topics: Sequence[str], kills: int, times: int = TIMES) -> LeaderKills:
        return cls(settings, cluster, topic, topics,
                   leader_kill_points(kills, times) if cluster is not None else frozenset())

    async def after(self, k: int) -> None:
        """After worker kill `k`: a leader kill when `k` is one of the points."""
        if self.cluster is None or k not in self.points:
            return
        leader = await faults.partition_leader(self.settings, self.topic, 0)
        log.info("kill -9 broker %d, the leader of %s/0 (down %.0f s)", leader, self.topic,
                 DOWN_S)
        await faults.kill_broker(self.cluster, leader)
        await asyncio.sleep(DOWN_S)  # the time the broker stays down
        await faults.restart_brokers(self.cluster)
        await faults.until(lambda: faults.fully_replicated(self.settings, list(self.topics),
                                                           REPLICAS),
                           IN_SYNC_WITHIN_S, "every partition back in sync")
        self.nodes.append(leader)
