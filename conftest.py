"""pytest reads the manual too: README.md's and docs/' blocks are tests (tests/docs/).

`pytest README.md docs/` runs them (`make integration` does); other runs never walk there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.docs.manual import collect_manual, count, summary_lines, tag_items


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    return collect_manual(file_path, parent)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tag_items(items)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in summary_lines(count(terminalreporter.stats)):
        terminalreporter.write_line(line)
