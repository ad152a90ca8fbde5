"""Counts in sentences: "1 letter", never "1 letters"."""

from __future__ import annotations

from stream_jobs.plurals import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert counted(1, "letter") == "1 letter"
    assert counted(0, "letter") == "0 letters"
    assert counted(2, "letter") == "2 letters"
    assert counted(1_204, "letter") == "1,204 letters"


def test_an_irregular_plural_is_given() -> None:
    assert counted(1, "entry", "entries") == "1 entry"
    assert counted(3, "entry", "entries") == "3 entries"
    assert counted(2, "matching letter") == "2 matching letters"
