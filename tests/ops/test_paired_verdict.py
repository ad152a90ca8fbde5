"""The cost-when-unused verdict on interleaved pairs (ops/bench/paired.py) and its row in
the goal tables (ops/bench/report/tables.py): a busy box or too few pairs say "not
settled", never NOT MET; a narrow interval, or one wholly on one side, decides."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ops.bench.paired import (
    LOAD_LIMIT,
    RESOLUTION,
    interleave,
    judge,
    median_interval,
    pairs_to_resolve,
)
from ops.bench.report.tables import FigureJSON, Goal, goal_rows, ratio_of

rates = st.floats(min_value=1_000.0, max_value=100_000.0)
loads = st.floats(min_value=0.0, max_value=8.0)


def _figure(name: str, values: list[float], loads: list[float]) -> FigureJSON:
    return {"name": name, "label": name, "unit": "jobs/s", "values": values, "note": "",
            "median": sorted(values)[len(values) // 2], "low": min(values),
            "high": max(values), "loads": loads}


def test_a_quiet_box_with_pairs_close_together_is_met() -> None:
    v = judge([99.0, 100.0, 101.0, 100.0, 99.5, 100.5, 100.0, 99.0], [100.0] * 8,
              [1.0] * 8, [1.1] * 8, ">=", 0.97)
    assert (v.status, v.met, v.pairs, v.load) == ("MET", True, 8, 1.1)
    assert 0.98 <= v.low <= v.ratio <= v.high <= 1.02


def test_a_clear_cost_is_not_met() -> None:
    v = judge([90.0, 91.0, 89.0, 90.0], [100.0] * 4, [1.0] * 4, [1.0] * 4, ">=", 0.97)
    assert (v.status, v.met) == ("NOT MET", False)


def test_a_busy_box_is_not_settled_and_names_its_load() -> None:
    v = judge([80.0] * 6, [100.0] * 6, [2.5] * 6, [1.0] * 6, ">=", 0.97)
    assert (v.met, v.status, v.load) == (None, "not settled", 2.5)


def test_a_wide_interval_across_the_target_asks_for_more_pairs() -> None:
    v = judge([90.0, 105.0, 96.0, 101.0], [100.0] * 4, [1.0] * 4, [1.0] * 4, ">=", 0.97)
    assert v.met is None
    assert v.status.startswith("not settled: ±")
    assert v.needed > 4


def test_slow_drains_in_a_few_pairs_do_not_move_the_median() -> None:
    clean = [100.0, 101.0, 99.0, 100.0, 100.5, 99.5]
    v = judge([*clean, 100.0, 100.0], [*[100.0] * 6, 55.0, 60.0], [1.0] * 8, [1.0] * 8,
              ">=", 0.97)
    assert 0.99 <= v.ratio <= 1.01


@given(st.lists(st.tuples(rates, rates, loads, loads), min_size=1, max_size=12),
       st.floats(min_value=0.5, max_value=1.5))
def test_the_verdict_never_says_not_met_on_a_busy_box(
        pairs: list[tuple[float, float, float, float]], target: float) -> None:
    num, den, num_loads, den_loads = (list(column) for column in zip(*pairs, strict=True))
    v = judge(num, den, num_loads, den_loads, ">=", target)
    assert v.low <= v.ratio <= v.high
    assert v.load_max >= v.load
    if v.load > LOAD_LIMIT:
        assert (v.met, v.status) == (None, "not settled")
    if v.met is not None:
        assert v.met == (v.ratio >= target)
        assert v.status == ("MET" if v.met else "NOT MET")
        # Settled: the interval is on one side of the target, or narrow enough.
        assert (v.low >= target) == (v.high >= target) or v.half_width <= RESOLUTION


@given(st.lists(st.floats(min_value=0.5, max_value=1.5), min_size=1, max_size=15))
def test_the_interval_holds_the_median_and_is_the_same_each_time(ratios: list[float]) -> None:
    low, high = median_interval(ratios)
    assert min(ratios) <= low <= high <= max(ratios)
    assert median_interval(ratios) == (low, high)


@given(st.integers(min_value=1, max_value=50), st.floats(min_value=0.0, max_value=0.5))
def test_more_pairs_are_asked_for_only_past_the_resolution(pairs: int, half: float) -> None:
    needed = pairs_to_resolve(pairs, half)
    assert needed >= pairs
    # The interval narrows as 1/sqrt(pairs): at `needed` it is within the resolution.
    assert half * (pairs / needed) ** 0.5 <= RESOLUTION + 1e-12


def test_interleave_turns_the_order_each_round_and_keeps_a_load_per_value() -> None:
    order: list[str] = []

    def measure(arm: str) -> float:
        order.append(arm)
        return float(len(order))

    found = interleave(["off", "on"], measure, 3, "test")
    assert order == ["off", "on", "on", "off", "off", "on"]
    assert found.values == {"off": [1.0, 4.0, 5.0], "on": [2.0, 3.0, 6.0]}
    assert [len(found.loads[arm]) for arm in ("off", "on")] == [3, 3]


def test_the_goal_table_prints_the_load_beside_the_verdict() -> None:
    figures = {"a": _figure("a", [100.0, 101.0, 99.0, 100.0], [1.2] * 4),
               "b": _figure("b", [100.0] * 4, [1.0] * 4)}
    goal = Goal("a >= 0.97x b", ("a", "b"), None, ">=", 0.97, "x")
    row = goal_rows(figures, [goal])[0]
    assert row[3] == "**MET** (load 1.2)"
    assert "4 interleaved pairs" in row[2]
    busy = {**figures, "a": _figure("a", [80.0] * 4, [3.0] * 4)}
    row = goal_rows(busy, [goal])[0]
    assert row[3] == "not settled (load 3.0)"
    assert ratio_of(figures, "a", "b")[3].startswith("interleaved pairs")


def test_figures_without_loads_keep_the_plain_verdict() -> None:
    a, b = _figure("a", [90.0, 91.0], []), _figure("b", [100.0, 100.0], [])
    row = goal_rows({"a": a, "b": b}, [Goal("a >= 0.97x b", ("a", "b"), None, ">=", 0.97,
                                            "x")])[0]
    assert row[3] == "**NOT MET**"
