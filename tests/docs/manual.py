"""The manual as a test: every block of README.md and docs/ runs, page by page, on the stack.

Why Sybil (and not pytest-markdown-docs): the manual's samples are chapters of one program
per page (a handler, then the enqueue that feeds it, then what the operator sees), and
Sybil gives each page one namespace its blocks share in order, set-up and tear-down per
page (our `Page`: a prefix, a schema, an environment), hidden blocks and skip/clear
directives written as HTML comments, which MkDocs and GitHub do not show, so a page's
source carries its test without the reader seeing any of it; and it lets us choose how a
block runs (top-level `await`; shell transcripts). pytest-markdown-docs marks blocks in the
fence's info string (`python notest`, `python continuation`), which the rendered page
keeps, runs each block on its own unless told, and has no per-page set-up.

`make integration` runs `pytest README.md docs/`; the summary line counts the samples that
ran and those marked fragments (`samples.py` says how a page marks them).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sybil import Document, Example, Sybil
from sybil.integration.pytest import SybilItem
from sybil.parsers.markdown import ClearNamespaceParser, SkipParser

from tests.docs.page import REPO, Page
from tests.docs.samples import FRAGMENT, Fragments, is_hidden, python_samples, toml_samples
from tests.docs.shell import shell_samples

PAGE_KEY = "_page"


def open_page(namespace: dict[str, Any]) -> None:
    path = Path(namespace["__file__"])
    page = Page(path, namespace)
    namespace[PAGE_KEY] = page
    page.open()


def close_page(namespace: dict[str, Any]) -> None:
    page: Page | None = namespace.pop(PAGE_KEY, None)
    if page is not None:
        page.close()


class PageDocument(Document):
    """A page whose namespace knows its file (for `open_page`)."""

    def __init__(self, text: str, path: str) -> None:
        super().__init__(text, path)
        self.namespace["__file__"] = path


MANUAL = Sybil(
    parsers=[python_samples(), *shell_samples(), toml_samples(), Fragments(), SkipParser(),
             ClearNamespaceParser()],
    path=str(REPO),
    patterns=["*.md"],
    setup=open_page,
    teardown=close_page,
    document_types={".md": PageDocument},
)


def in_manual(path: Path) -> bool:
    """README.md and the pages under docs/ (not the run reports under ops/)."""
    try:
        relative = path.resolve().relative_to(REPO)
    except ValueError:
        return False
    return path.suffix == ".md" and (relative == Path("README.md")
                                     or relative.parts[0] == "docs")


def collect_manual(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if not in_manual(file_path):
        return None
    collect = MANUAL.pytest()
    return collect(file_path, parent)  # type: ignore[no-any-return]


# -- what kind of block each item is, and the count at the end ------------------------------

KIND = "manual"
KINDS = ("python", "shell", "toml")


def kind_of(example: Example) -> str:
    """`python` or `shell` for a sample, `hidden` for a hidden block, `directive` else."""
    lexemes = example.region.lexemes or {}
    if "source" not in lexemes:
        return "directive"
    if is_hidden(example):
        return "hidden"
    language = str(lexemes.get("arguments", "")).split()[0] if lexemes.get("arguments") else ""
    return "shell" if language in ("bash", "console") else language or "text"


def tag_items(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, SybilItem):
            item.user_properties.append((KIND, kind_of(item.example)))


def count(reports: dict[str, list[Any]]) -> dict[str, Counter[str]]:
    """Per kind of sample: how many ran, were fragments, were skipped, failed."""
    counts: dict[str, Counter[str]] = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in reports.get(outcome, []):
            kind = dict(getattr(report, "user_properties", ())).get(KIND)
            if kind not in KINDS:
                continue
            if outcome == "passed" and report.when != "call":
                continue
            counted = outcome
            if outcome == "skipped":
                reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple)
                             else report.longrepr)
                counted = "fragment" if f"{FRAGMENT}:" in reason else "skipped"
            counts.setdefault(kind, Counter())[counted] += 1
    return counts


def summary_lines(counts: dict[str, Counter[str]]) -> list[str]:
    lines = []
    for kind in KINDS:
        found = counts.get(kind)
        if not found:
            continue
        total = sum(found.values())
        lines.append(f"manual {kind} samples: {found['passed']} ran, {found['fragment']} "
                     f"marked fragments, {found['skipped']} skipped, "
                     f"{found['failed'] + found['error']} failed, of {total}")
    return lines
