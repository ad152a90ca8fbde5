"""A type's stats from a reading of Kafka made by hand: `type_stats` without a broker."""

from __future__ import annotations

from stream_jobs.dlq.tally import DlqCounts
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.runtime.reports import ShadowReport, WorkerReport
from stream_jobs.runtime.throttle import RateOverride
from stream_jobs.tools.type_stats import StatsReading, type_stats

NOW = 1_700_000_000_000
P = "jobs"
POLICY = JobTypePolicy("mail", partitions=2, priorities=("high", "default"),
                       retry_tiers=("5s", "1m"), rate_limit_per_s=50.0)
HIGH, DEFAULT = "jobs.mail.high", "jobs.mail"
TIER_5S, TIER_1M, DLQ = "jobs.mail.retry-5s", "jobs.mail.retry-1m", "jobs.mail.dlq"


def tps(topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, 0), TopicPartition(topic, 1)]


def reading(**changes: object) -> StatsReading:
    """Two lanes with a backlog on the default lane, one tier waiting, a DLQ of 3; the
    1-minute tier was never applied."""
    parts = {t: tps(t) for t in (HIGH, DEFAULT, TIER_5S, DLQ)}
    offsets = {tp: (10, 20) for topic in parts.values() for tp in topic}
    offsets[TopicPartition(DLQ, 0)] = (0, 3)
    offsets[TopicPartition(DLQ, 1)] = (5, 5)
    fields: dict[str, object] = {
        "at_ms": NOW,
        "partitions": parts,
        "beginnings": {tp: b for tp, (b, _) in offsets.items()},
        "ends": {tp: e for tp, (_, e) in offsets.items()},
        "committed": {
            TopicPartition(HIGH, 0): 20, TopicPartition(HIGH, 1): 20,
            TopicPartition(DEFAULT, 0): 15, TopicPartition(DEFAULT, 1): None,
            TopicPartition(TIER_5S, 0): 19, TopicPartition(TIER_5S, 1): 20,
        },
        "head_stamps": {TopicPartition(DEFAULT, 0): NOW - 4_000,
                        TopicPartition(DEFAULT, 1): NOW - 9_000},
        "reports": [
            WorkerReport("mail", "w1", NOW - 61_000, NOW - 100_000, {"succeeded": 10}),
            WorkerReport("mail", "w1", NOW - 1_000, NOW - 100_000,
                         {"succeeded": 70, "duplicate": 2, "retried": 6},
                         in_flight=4, rate_limit_per_s=25.0, rate_share_per_s=25.0),
            WorkerReport("other", "w9", NOW - 1_000, NOW - 100_000, {"succeeded": 500}),
        ],
    }
    fields.update(changes)
    return StatsReading(**fields)  # type: ignore[arg-type]


def test_lag_and_oldest_age_come_from_the_worker_groups_commits() -> None:
    stats = type_stats(POLICY, reading(), prefix=P, per_partition=True)
    high, default = stats.lanes
    assert (high.name, high.lag, high.oldest_age_s) == ("high", 0, None)
    # Partition 0: 20 - 15; partition 1 never committed: 20 - 10 from its beginning.
    assert default.lag == 15
    assert [p.lag for p in default.partitions] == [5, 10]
    assert [p.committed for p in default.partitions] == [15, None]
    assert default.oldest_age_s == 9.0
    assert stats.lag == 15
    assert stats.oldest_age_s == 9.0


def test_tiers_dlq_and_missing_topics() -> None:
    stats = type_stats(POLICY, reading(), prefix=P)
    tier_5s, tier_1m = stats.tiers
    assert (tier_5s.lag, tier_5s.exists, tier_5s.partitions) == (1, True, ())
    assert (tier_1m.lag, tier_1m.exists) == (0, False)
    assert stats.dlq_depth == 3
    assert stats.missing_topics == [TIER_1M]
    no_dlq = reading(partitions={t: tps(t) for t in (HIGH, DEFAULT, TIER_5S)})
    assert type_stats(POLICY, no_dlq, prefix=P).dlq_depth is None


def test_the_dlq_counts_jobs_beside_letters() -> None:
    counted = type_stats(POLICY, reading(dlq_counts={DLQ: DlqCounts(letters=3, jobs=2)}),
                         prefix=P)
    assert (counted.dlq_depth, counted.dlq_jobs) == (3, 2)
    assert counted.to_dict(per_partition=False)["dlq"] == {
        "topic": DLQ, "depth": 3, "letters": 3, "jobs": 2, "repeats": 1}
    unread = type_stats(POLICY, reading(), prefix=P)  # a reading that did not count
    assert (unread.dlq, unread.dlq_jobs) == (None, None)


def test_rates_and_workers_are_the_types_own() -> None:
    stats = type_stats(POLICY, reading(), prefix=P, window_s=60)
    # w1 went from 10 to 72 done (succeeded + duplicate) and 0 to 6 retried in the window;
    # w9 works for another type.
    assert (stats.rates.counts.done, stats.rates.counts.retried) == (62, 6)
    assert [w.worker_id for w in stats.workers] == ["w1"]
    assert stats.to_dict(per_partition=False)["rate_limit"] == {
        "per_s": 50.0, "source": "toml", "workers_applying": 0, "share_per_s": 25.0}


def test_a_throttle_override_wins_over_the_toml() -> None:
    throttled = reading(overrides={"mail": RateOverride(10.0, NOW - 5_000, "throttle")})
    stats = type_stats(POLICY, throttled, prefix=P)
    assert (stats.rate.per_s, stats.rate.source) == (10.0, "throttle")


def test_shadow_stats_only_for_a_shadowed_type() -> None:
    assert type_stats(POLICY, reading(), prefix=P).shadow is None
    shadowed = reading(shadowed={tp: 18 for tp in tps(DEFAULT)},
                       shadow_reports=[ShadowReport("mail", "s1", NOW - 1_000, NOW - 50_000)])
    shadow = type_stats(POLICY, shadowed, prefix=P).shadow
    assert shadow is not None
    assert shadow.group == "jobs.mail.shadow"
    # 20 - 18 on each default-lane partition; the shadow group never read the high lane.
    lanes = {lane.name: (lane.topic, lane.lag) for lane in shadow.lanes}
    assert lanes == {"high": (HIGH, 20), "default": (DEFAULT, 4)}
    assert shadow.lag == 24
