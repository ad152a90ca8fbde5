"""Markdown for the generated pages: text shown as written, and tables of it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
# Outside code spans these would be read as emphasis, links, HTML or a table's columns.
MARKUP = {"\\": "\\\\", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]", "|": "\\|",
          "<": "&lt;", ">": "&gt;"}


def inline(text: str) -> str:
    """`text` as one line of Markdown that shows it as written; its code spans stay code."""
    text = " ".join(text.split())
    out: list[str] = []
    at = 0
    for span in CODE_SPAN.finditer(text):
        out.append(_escape(text[at:span.start()]))
        out.append(span.group(0))
        at = span.end()
    out.append(_escape(text[at:]))
    return "".join(out)


def paragraphs(text: str) -> str:
    """A docstring or comment of several paragraphs (blank-line separated) as Markdown."""
    parts = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(inline(part) for part in parts if part.strip())


def code(text: str) -> str:
    """`text` as a code span (a longer fence where the text holds backticks)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; the cells are Markdown already (see `inline`)."""
    lines = [_row(header), _row(["---"] * len(header))]
    lines += [_row(row) for row in rows]
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _escape(text: str) -> str:
    return "".join(MARKUP.get(char, char) for char in text)
