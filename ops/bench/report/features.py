"""The sections of RESULTS.md that belong to one feature each (the outbox, results and
batches, cancel/unique/debounce, the gateway, JobTester): each feature's module declares
its HEADING, INTRO, PREFIX, GOALS and RATIOS, and measures its figures. Pure."""

from __future__ import annotations

from types import ModuleType

from ops.bench.report.tables import (
    RATIO_COLUMNS,
    FigureJSON,
    figures_table,
    goals_block,
    ratio_rows,
    table,
)


def feature_section(figures: dict[str, FigureJSON], feature: ModuleType) -> list[str]:
    """The section of one feature module: its goals, the ratios measured side by side,
    then every figure under its PREFIX; nothing when it was not measured."""
    mine = {k: v for k, v in figures.items() if k.startswith(feature.PREFIX)}
    if not mine:
        return []
    out = [f"## {feature.HEADING}", "", feature.INTRO, ""]
    out += goals_block(figures, feature.GOALS)
    rows = ratio_rows(mine, feature.RATIOS)
    if rows:
        out += [table(RATIO_COLUMNS, rows), ""]
    return [*out, figures_table(mine.values()), ""]
