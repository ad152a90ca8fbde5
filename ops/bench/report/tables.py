"""The tables every part of RESULTS.md is made of: figures as results.json keeps them,
numbers formatted, ratios with their spread, and goals judged MET / NOT MET with by how
much; a goal on the arms of an interleaved measurement (cost when unused,
ops/bench/paired.py) on its pairs, with the load beside the verdict and "not settled"
where the run could not tell. Pure.

A section module declares its goals as `GOALS`, rows of (text, the figure or a ratio's
numerator, the ratio's denominator or None, op, target, unit); `goals_of` reads them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from ops.bench.paired import RESOLUTION, judge


class FigureJSON(TypedDict):
    """An `ops.bench.common.Figure` as results.json keeps it."""

    name: str
    label: str
    unit: str
    values: list[float]
    note: str
    median: float
    low: float
    high: float
    loads: NotRequired[list[float]]  # interleaved arms only: the load after each value


@dataclass(frozen=True)
class Goal:
    """What a figure, or the ratio of two, must reach: MET when `value op target`."""

    text: str
    ratio: tuple[str, str] | None  # (numerator, denominator) or None for a plain figure
    figure: str | None
    op: str  # ">=", "<=" or "<"
    target: float
    unit: str


# (text, figure or numerator, denominator or None, op, target, unit): a module's GOALS row.
GoalSpec = tuple[str, str, str | None, str, float, str]


def goals_of(specs: Iterable[GoalSpec]) -> list[Goal]:
    """A section module's GOALS rows as `Goal`s."""
    return [Goal(text, (num, den) if den else None, None if den else num, op, target, unit)
            for text, num, den, op, target, unit in specs]


def fmt(value: float, unit: str = "") -> str:
    if unit in ("x",):
        return f"{value:.2f}x"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio_of(figures: dict[str, FigureJSON], num: str, den: str) -> tuple[float, float, float, str]:
    """(median ratio, low, high, how the spread was taken)."""
    a, b = figures[num], figures[den]
    median = a["median"] / b["median"]
    if len(a["values"]) == len(b["values"]) > 1:
        paired = [x / y for x, y in zip(a["values"], b["values"], strict=True)]
        if interleaved(a, b):
            return (statistics.median(paired), min(paired), max(paired),
                    "interleaved pairs (median of the pairs)")
        return median, min(paired), max(paired), "paired by run"
    return median, a["low"] / b["high"], a["high"] / b["low"], "extremes"


def interleaved(a: FigureJSON, b: FigureJSON) -> bool:
    """Whether two figures are arms of one interleaved measurement (ops/bench/paired.py):
    values round by round, with the load after each."""
    return (len(a.get("loads", [])) == len(a["values"]) == len(b["values"])
            == len(b.get("loads", [])) > 0)


def _interleaved_row(goal: Goal, a: FigureJSON, b: FigureJSON) -> list[str]:
    """A cost-when-unused goal judged on its pairs: the interval, the load beside the
    verdict, and "not settled" where the run could not tell (ops/bench/paired.py)."""
    v = judge(a["values"], b["values"], a.get("loads", []), b.get("loads", []), goal.op,
              goal.target)
    status = f"**{v.status}**" if v.met is not None else v.status
    how = (_by_how_much(goal.op, v.ratio, goal.target, goal.unit) if v.met is not None
           else f"median {v.ratio / goal.target - 1:+.0%} from the target")
    per_run = [x / y for x, y in zip(a["values"], b["values"], strict=True)]
    meeting = sum(_met(goal.op, r, goal.target) for r in per_run)
    return [goal.text, fmt(v.ratio, "x"),
            f"{fmt(v.low, 'x')} - {fmt(v.high, 'x')} (95%, {v.pairs} interleaved pairs; "
            f"±{RESOLUTION:.0%} needs {v.needed})",
            f"{status} (load {v.load:.1f})", how,
            f"{meeting}/{len(per_run)}"]


def _met(op: str, value: float, target: float) -> bool:
    return value >= target if op == ">=" else value <= target if op == "<=" else value < target


def _by_how_much(op: str, value: float, target: float, unit: str) -> str:
    if op == ">=":
        pct = (value / target - 1) * 100
        if value >= target:
            return f"{pct:+.0f}% above the target"
        return f"short by {-pct:.0f}%: needs {target / value:.2f}x the measured figure"
    diff = value - target
    amount = f"{abs(diff):.2f}x" if unit == "x" else f"{abs(diff):.1f} {unit.split()[0]}"
    if _met(op, value, target):
        return f"{amount} under the limit"
    return f"over by {amount} ({diff / target * 100:+.0f}%)"


def goal_rows(figures: dict[str, FigureJSON], goals: Sequence[Goal]) -> list[list[str]]:
    """A row per goal: the measured value, its spread, MET or NOT MET, by how much, and in
    how many runs it was met."""
    rows = []
    for goal in goals:
        names = list(goal.ratio) if goal.ratio else [goal.figure or ""]
        if any(n not in figures for n in names):
            rows.append([goal.text, "not measured", "", "NOT MEASURED", "", ""])
            continue
        if goal.ratio and interleaved(figures[goal.ratio[0]], figures[goal.ratio[1]]):
            rows.append(_interleaved_row(goal, figures[goal.ratio[0]],
                                         figures[goal.ratio[1]]))
            continue
        if goal.ratio:
            value, low, high, _ = ratio_of(figures, *goal.ratio)
            a, b = figures[goal.ratio[0]], figures[goal.ratio[1]]
            per_run = ([x / y for x, y in zip(a["values"], b["values"], strict=True)]
                       if len(a["values"]) == len(b["values"]) else [value])
        else:
            fig = figures[goal.figure or ""]
            value, low, high, per_run = fig["median"], fig["low"], fig["high"], fig["values"]
        met = _met(goal.op, value, goal.target)
        unit = goal.unit
        spread = f"{fmt(low, unit)} - {fmt(high, unit)}"
        meeting = sum(_met(goal.op, v, goal.target) for v in per_run)
        rows.append([goal.text, f"{fmt(value, unit)} {'' if unit == 'x' else unit}".strip(),
                     spread, "**MET**" if met else "**NOT MET**",
                     _by_how_much(goal.op, value, goal.target, unit),
                     f"{meeting}/{len(per_run)}"])
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)



def goals_table(figures: dict[str, FigureJSON], goals: Sequence[Goal]) -> str:
    return table(["goal", "measured (median)", "spread", "status", "by how much",
                  "runs meeting it"], goal_rows(figures, goals))


def goals_block(figures: dict[str, FigureJSON], specs: Iterable[GoalSpec]) -> list[str]:
    """A section's goals table (from its module's GOALS) and a blank line; nothing for a
    section without goals."""
    goals = goals_of(specs)
    return [goals_table(figures, goals), ""] if goals else []


def figures_table(figures: Iterable[FigureJSON]) -> str:
    """Each figure with its median, spread, runs and note."""
    return table(["figure", "median", "spread (min - max)", "runs", "notes"],
                 [[f["label"], f"{fmt(f['median'])} {f['unit']}",
                   f"{fmt(f['low'])} - {fmt(f['high'])}", str(len(f["values"])), f["note"]]
                  for f in figures])


RATIO_COLUMNS = ["ratio", "median", "spread", "spread taken"]


def ratio_rows(figures: dict[str, FigureJSON],
               ratios: Iterable[tuple[str, str, str]]) -> list[list[str]]:
    """A row per (name, numerator, denominator) ratio whose two figures were measured."""
    rows = []
    for name, num, den in ratios:
        if num in figures and den in figures:
            value, low, high, how = ratio_of(figures, num, den)
            rows.append([name, f"{value:.2f}x", f"{low:.2f}x - {high:.2f}x", how])
    return rows
