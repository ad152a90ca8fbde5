"""The verdict of an outbox-relay trial (ops/chaos/relay_trial.py), from what the writers
committed and rolled back, the job IDs in the lane topic and the effect rows. Pure.

The promises under test (docs/outbox.md, "Failure behaviour"): a relay killed with SIGKILL
mid-batch loses nothing, since its locks go with its connection and another relay takes
the rows; rows it had sent but not deleted are sent again with the same job ID, and
`ctx.once()` absorbs the copy; a transaction that rolled back never reaches Kafka.
Counted: every committed job ID is in the lane topic (copies allowed, and counted), none
of a rolled-back transaction is; every committed job has exactly one effect row, a
rolled-back one none; the outbox is empty at the end.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RelayEvidence:
    committed: frozenset[str]  # job IDs of the transactions that committed
    rolled_back: frozenset[str]  # job IDs written in transactions that rolled back
    in_kafka: tuple[str, ...]  # the job ID header of every record of the lane topic
    effects: dict[str, int]  # job ID -> effect rows
    left_in_outbox: int  # rows still waiting at the end


@dataclass
class RelayVerdict:
    committed: int
    lost: int  # committed, never in Kafka
    copies_in_kafka: int  # records beyond one per job ID (allowed: a relay killed mid-round)
    missing_effects: int
    duplicate_effects: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(evidence: RelayEvidence) -> RelayVerdict:
    """What the evidence shows, and every broken promise as a sentence."""
    e = evidence
    sent = Counter(e.in_kafka)
    lost = sorted(e.committed - set(sent))
    ghosts = sorted(e.rolled_back & set(sent))
    strangers = sorted(set(sent) - e.committed - e.rolled_back)
    missing = sorted(j for j in e.committed if e.effects.get(j, 0) == 0)
    doubled = sum(n - 1 for j, n in e.effects.items() if n > 1)
    unwanted = sum(n for j, n in e.effects.items() if j not in e.committed)
    problems: list[str] = []
    if lost:
        problems.append(f"{len(lost)} committed jobs never reached Kafka (e.g. {lost[0]})")
    if ghosts:
        problems.append(f"{len(ghosts)} jobs of rolled-back transactions reached Kafka "
                        f"(e.g. {ghosts[0]})")
    if strangers:
        problems.append(f"{len(strangers)} job IDs in Kafka were never written "
                        f"(e.g. {strangers[0]})")
    if missing:
        problems.append(f"{len(missing)} committed jobs have no effect (e.g. {missing[0]})")
    if doubled:
        problems.append(f"{doubled} effects happened twice")
    if unwanted:
        problems.append(f"{unwanted} effect rows belong to no committed job")
    if e.left_in_outbox:
        problems.append(f"{e.left_in_outbox} rows still wait in the outbox")
    copies = sum(n - 1 for n in sent.values() if n > 1)
    return RelayVerdict(len(e.committed), len(lost), copies, len(missing), doubled, problems)


__all__ = ["RelayEvidence", "RelayVerdict", "judge"]
