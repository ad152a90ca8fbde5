"""The pure rules of fair queues: the tenant rotation, the noisy judge, the [fairness] table.

Properties (hypothesis): no tenant starves while it has work (each is served within one
round of `sum(weights)` starts); while tenants stay backlogged, each gets its weight's
share of every round exactly; a held tenant never starts and loses nothing; items of one
tenant leave in the order they came.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.errors import ConfigError
from stream_jobs.fairness.noisy import MIN_BUSY_S, NoisyJudge
from stream_jobs.fairness.rotation import TenantRotation
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.naming import parse_topic, validate_job_type
from stream_jobs.tenants import FairnessSpec

Item = tuple[str, int]

tenants = st.sampled_from(["a", "b", "c", "d", "e"])
weights = st.dictionaries(tenants, st.integers(1, 5))


def rotation(weight: dict[str, int] | None = None) -> TenantRotation[Item]:
    return TenantRotation(lambda item: item[0], lambda t: (weight or {}).get(t, 1))


@given(st.lists(tenants, min_size=1, max_size=200), weights)
def test_no_tenant_waits_more_than_a_round_and_each_keeps_its_order(
        arrivals: list[str], weight: dict[str, int]) -> None:
    queue = rotation(weight)
    for i, tenant in enumerate(arrivals):
        queue.append((tenant, i))
    served: list[Item] = []
    while queue:
        served.append(queue.popleft())
    assert sorted(served) == sorted((t, i) for i, t in enumerate(arrivals))
    for tenant in set(arrivals):
        mine = [i for t, i in served if t == tenant]
        assert mine == sorted(mine)
    # While a tenant has work, at most one round of the others' turns passes between two
    # of its starts.
    round_size = sum(weight.get(t, 1) for t in set(arrivals))
    for tenant in set(arrivals):
        at = [n for n, (t, _) in enumerate(served) if t == tenant]
        gaps = [b - a for a, b in zip([-1, *at], at, strict=False)]
        assert max(gaps) <= round_size


@given(weights.filter(lambda w: len(w) >= 2), st.integers(1, 5))
def test_backlogged_tenants_share_each_round_by_weight(weight: dict[str, int],
                                                       rounds: int) -> None:
    queue = rotation(weight)
    for tenant, w in weight.items():
        for i in range(w * rounds * 2):  # more than the rounds below take
            queue.append((tenant, i))
    round_size = sum(weight.values())
    served = Counter(queue.popleft()[0] for _ in range(round_size * rounds))
    assert served == {tenant: w * rounds for tenant, w in weight.items()}


def test_a_held_tenant_does_not_start_and_comes_back_whole() -> None:
    queue = rotation()
    for i in range(3):
        queue.append(("a", i))
        queue.append(("b", i))
    queue.hold("a")
    assert len(queue) == 3
    assert [queue.popleft() for _ in range(3)] == [("b", 0), ("b", 1), ("b", 2)]
    assert not queue
    with pytest.raises(IndexError):
        queue.popleft()
    queue.appendleft(("a", -1))  # a refused start goes back in front
    assert not queue
    queue.release_hold("a")
    assert [queue.popleft() for _ in range(4)] == [("a", -1), ("a", 0), ("a", 1), ("a", 2)]


def test_a_flood_of_one_tenant_does_not_delay_a_newcomer() -> None:
    queue = rotation()
    for i in range(50_000):
        queue.append(("flood", i))
    queue.popleft()
    queue.append(("quiet", 0))
    assert [queue.popleft()[0] for _ in range(2)].count("quiet") == 1


def spec(**changes: object) -> FairnessSpec:
    return FairnessSpec(**changes)  # type: ignore[arg-type]


def test_a_tenant_with_its_share_of_jobs_in_flight_is_noisy() -> None:
    judge = NoisyJudge(spec(noisy_share=0.1, noisy_min_jobs=30))
    for _ in range(29):
        judge.took("a")
    assert not judge.is_noisy("a", 0.0)  # fewer than 30 of its own
    judge.took("a")
    assert judge.is_noisy("a", 0.0)
    for _ in range(300):
        judge.took("b")
    assert judge.is_noisy("b", 0.0)
    assert not judge.is_noisy("a", 0.0)  # 30 of 330: under 10 %
    for _ in range(300):
        judge.finished("b")
    assert judge.is_noisy("a", 0.0)
    assert judge.noisy(0.0) == ["a"]


def test_processing_time_makes_a_tenant_noisy_and_fades() -> None:
    judge = NoisyJudge(spec(noisy_time_share=0.5, noisy_window_s=10.0))
    judge.ran("slow", MIN_BUSY_S / 2, 0.0)
    assert not judge.is_noisy("slow", 0.0)  # under the least time that counts
    judge.ran("slow", 5.0, 1.0)
    judge.ran("quick", 0.5, 1.0)
    assert judge.is_noisy("slow", 1.0)
    assert not judge.is_noisy("quick", 1.0)
    # A minute later, with quick's recent work: slow's old time has faded.
    judge.ran("quick", 2.0, 61.0)
    assert not judge.is_noisy("slow", 61.0)
    judge.forget_idle(200.0)
    assert judge.noisy(200.0) == []


@given(st.lists(st.tuples(tenants, st.booleans()), max_size=300))
def test_in_flight_counts_never_go_negative(events: list[tuple[str, bool]]) -> None:
    judge = NoisyJudge(spec())
    for tenant, took in events:
        if took:
            judge.took(tenant)
        elif judge.in_flight.get(tenant):
            judge.finished(tenant)
    assert judge.total == sum(judge.in_flight.values())
    assert all(count > 0 for count in judge.in_flight.values())


def test_the_fairness_table_reads_and_refuses_with_one_sentence() -> None:
    read = FairnessSpec.from_toml({"weights": {"acme": 3}, "tenant_concurrency": 10,
                                   "tenant_rate": "50/s", "noisy_window": "30s",
                                   "tenants": {"acme": {"concurrency": 50, "rate": "5/s"}}})
    assert read.weight_of("acme") == 3
    assert read.weight_of("other") == 1
    assert read.concurrency_of("acme") == 50
    assert read.concurrency_of("x") == 10
    assert read.rate_of("acme") == 5
    assert read.rate_of("x") == 50
    assert read.noisy_window_s == 30
    assert read.limited
    assert not FairnessSpec().limited
    for bad, says in [
            ({"weights": {"a": 0}}, "fairness.weights.a must be a whole number"),
            ({"noisy_share": 1.5}, "fairness.noisy_share must be a share between 0 and 1"),
            ({"overflow": "yes"}, "fairness.overflow must be true or false"),
            ({"tenant_rate": "fast"}, "fairness.tenant_rate 'fast' is not a rate"),
            ({"tenants": {"a": {"limit": 1}}}, "fairness.tenants.a.limit is not known"),
            ({"tenants": {"x" * 200: {}}}, "at most 128 bytes"),
            ({"wieghts": {}}, "did you mean 'weights'?"),
            ("on", "'fairness' must be a table")]:
        with pytest.raises(ConfigError, match=says.replace("?", r"\?").replace(".", r"\.")):
            FairnessSpec.from_toml(bad)


def test_overflow_is_a_reserved_name_and_a_role() -> None:
    with pytest.raises(ConfigError, match="ends in 'overflow'"):
        validate_job_type("bulk.overflow")
    assert parse_topic("jobs", "jobs.bulk.overflow").role == "overflow"
    policy = JobTypePolicy.from_toml({"fairness": {}}, job_type="bulk")
    assert [s.name for s in policy.all_topics("jobs") if s.role == "overflow"] == [
        "jobs.bulk.overflow"]
    quiet = JobTypePolicy.from_toml({"fairness": {"overflow": False}}, job_type="bulk")
    assert not [s for s in quiet.all_topics("jobs") if s.role == "overflow"]
