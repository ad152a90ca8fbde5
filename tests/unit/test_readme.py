"""The README shows the tour's real code: its handler block is `consumers/mail.py` as it is,
and its `psql` line creates the table that file writes to (tests/integration/test_tour.py
runs the file on the real stack)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from consumers import mail

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def test_the_tours_handler_block_is_consumers_mail_py() -> None:
    source = (REPO / "consumers" / "mail.py").read_text()
    shown = blocks("python")
    if source in shown:
        return
    nearest = max(shown, key=lambda block: difflib.SequenceMatcher(None, block, source).ratio())
    diff = "".join(difflib.unified_diff(nearest.splitlines(keepends=True),
                                        source.splitlines(keepends=True),
                                        "README.md", "consumers/mail.py"))
    raise AssertionError(f"README.md's tour no longer shows consumers/mail.py as it is:\n{diff}")


def test_the_tour_creates_the_table_the_handler_writes_to() -> None:
    commands = "\n".join(blocks("bash")).replace("\\\n", " ")
    assert f'-c "{mail.SCHEMA}"' in commands


def test_the_two_commands_come_first() -> None:
    top = "\n".join(README.read_text().splitlines()[:40])
    assert "make demo" in top
    assert "make test" in top
