"""The faults a trial's run meets beyond its own in the runner's other stages: leader
kills on the 3-node cluster (`leaders.py`) and the workers' Postgres link cut through
Toxiproxy (`pg_link.py`), both after some of the run's paced worker kills
(`paced.kill_per_share`'s `after`). On the single broker a `StageFaults` does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ops.chaos.leaders import DOWN_S, REPLICAS, TIMES, LeaderKills
from ops.chaos.pg_link import BLACKHOLE_S, SETTLE_S, PgLinkCut, cut_point
from ops.chaos.trial import Stack
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.naming import lane_topic
from stream_jobs.settings import Settings

# What the runs in the other stages add, in the words of RESULTS.md (`OwnTrial.elsewhere`).
LEADER_KILLS = (f"topics of replication 3 (min ISR 2); after the process kills a third and "
                f"two thirds of the way through, the broker leading partition 0 of a lane is "
                f"SIGKILLed, kept down {DOWN_S:.0f} s and started again, and the run goes on "
                f"once every partition is back in sync ({TIMES} leader kills).")
PG_LINK_CUT = (f"the workers reach the broker and Postgres through Toxiproxy (the runner "
               f"goes direct); after the worker kill that follows the Postgres restart, "
               f"both of the workers' Postgres links (pools, LISTEN) are blackholed for "
               f"{BLACKHOLE_S:.0f} s, healed, and {SETTLE_S:.0f} s later every connection "
               f"on them is reset (RST) once. Same checks.")


@dataclass
class StageFaults:
    leaders: LeaderKills
    link: PgLinkCut

    async def after(self, k: int) -> None:
        """After worker kill `k` (from 1): whichever of the two falls there."""
        await self.leaders.after(k)
        await self.link.after(k)

    def counts(self) -> dict[str, int]:
        """The row's counts of them (the `@cluster` and `@net` sections' first column)."""
        return {"leader_kills": len(self.leaders.nodes), "link_faults": self.link.cuts}


def stage_faults(stack: Stack | None, settings: Settings, policies: Sequence[JobTypePolicy],
                 kills: int) -> StageFaults:
    """The faults of `stack`'s stage (none without one) for a run of `kills` worker kills
    whose settings are `settings`: leaders of the first type's default lane's partition 0
    killed (every topic of `policies` back in sync after each), the workers' Postgres link
    cut once."""
    cluster = stack.cluster if stack is not None else None
    net = stack.net if stack is not None else None
    prefix = settings.topic_prefix
    topics = [spec.name for policy in policies for spec in policy.all_topics(prefix)]
    topic = lane_topic(prefix, policies[0].job_type)
    return StageFaults(LeaderKills.of(cluster, settings, topic, topics, kills),
                       PgLinkCut(net, cut_point(kills) if net is not None and kills else 0))


def replication(stack: Stack | None) -> int:
    """The replication factor of a trial's topics on `stack`: 3 on the cluster."""
    return REPLICAS if stack is not None and stack.cluster is not None else 1


def worker_env(stack: Stack | None) -> dict[str, str]:
    """What the trial's workers' environment says differently (the proxies' addresses in
    the network stage)."""
    return stack.worker_env() if stack is not None else {}
