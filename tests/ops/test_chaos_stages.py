"""Which trial runs where in `make chaos`, and when a run's extra faults fall: the pure
parts of ops/chaos/run.py, protocol.py, leaders.py and pg_link.py."""

from __future__ import annotations

import pytest

from ops.chaos.leaders import leader_kill_points
from ops.chaos.pg_link import cut_point
from ops.chaos.protocol import CLUSTER, NETWORK, OwnTrial, elsewhere
from ops.chaos.run import TRIALS, chosen, stages


def test_leader_kills_are_spread_and_miss_the_postgres_restart() -> None:
    assert leader_kill_points(6) == {2, 5}
    assert leader_kill_points(8) == {3, 6}
    assert leader_kill_points(10) == {4, 7}
    for kills in range(1, 12):
        points = leader_kill_points(kills)
        assert points <= set(range(1, kills + 1))
        assert len(points) == (2 if kills > 2 else 1)
        if kills > 1:  # the middle kill is the Postgres restart's
            assert (kills + 1) // 2 not in points


def test_no_kills_no_leader_kills() -> None:
    assert leader_kill_points(0) == frozenset()
    assert leader_kill_points(5, times=0) == frozenset()


def test_the_link_is_cut_after_the_kill_that_follows_the_postgres_restart() -> None:
    assert cut_point(6) == 4
    assert cut_point(5) == 4
    assert cut_point(1) == 1
    assert cut_point(2) == 2
    with pytest.raises(ValueError, match="no worker kills"):
        cut_point(0)


def test_a_trial_elsewhere_has_its_own_name_section_and_first_column() -> None:
    base = TRIALS["batches"]
    there = elsewhere(base, CLUSTER)
    assert there.name == "batches@cluster"
    assert there.stage == CLUSTER
    assert there.heading != base.heading
    assert base.elsewhere[CLUSTER] in there.method
    assert there.columns == ("leader kill -9", *base.columns)
    row = {"leader_kills": 2, "members": 10, "workers": 3, "kills": 6, "pg_restarts": 1,
           "lost": 0, "duplicate_effects": 0, "callbacks": {"success": 1, "complete": 1},
           "callback_runs": 2, "seconds": 5.0, "ok": True}
    assert there.cells(row) == ["2", *base.cells(row)]
    assert there.summary(row).endswith("2 leader kill -9")
    assert not there.elsewhere


def test_a_trial_without_a_run_in_a_stage_says_so() -> None:
    with pytest.raises(ValueError, match="no run in the network stage"):
        elsewhere(TRIALS["failover"], NETWORK)


def test_stages_put_each_trial_where_it_runs() -> None:
    plan = stages(*chosen("batches,batches@cluster,batches@net,kill9,leader-kill"))
    assert [t.name for t in plan.own] == ["batches"]
    assert [t.name for t in plan.cluster_trials] == ["batches@cluster"]
    assert [t.name for t in plan.network_trials] == ["batches@net"]
    assert [s.name for s in plan.single] == ["kill9"]
    assert [s.name for s in plan.cluster] == ["leader-kill"]
    assert not plan.network


def test_every_trial_of_a_feature_writing_to_kafka_runs_on_the_cluster() -> None:
    plan = stages(*chosen(""))
    assert {t.name for t in plan.cluster_trials} == {
        "batches@cluster", "results@cluster", "fairness@cluster", "outbox-relay@cluster",
        "unique@cluster", "failover@cluster"}
    assert {t.name for t in plan.network_trials} == {
        "batches@net", "cancels@net", "results@net", "fairness@net", "outbox-relay@net",
        "unique@net"}
    assert all(t.stage == "single" for t in plan.own)
    assert all(isinstance(t, OwnTrial) for t in TRIALS.values())
