"""A count and its noun as a person writes them: "1 letter", "0 letters", "1,204 letters".

Every count in the CLI's sentences goes through `counted`, so none says "1 letters".
"""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` (with thousands separators) and `noun`, or its plural when `n` is not 1.

    The plural is `noun` + "s" unless given: `counted(2, "entry", "entries")`. `noun` may
    be several words, the last one counted: `counted(3, "matching letter")`.
    """
    return f"{n:,} {noun if n == 1 else (plural if plural is not None else noun + 's')}"


__all__ = ["counted"]
