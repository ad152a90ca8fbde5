"""A partial bench run (BENCH_ONLY) replaces only its own `## ` sections of RESULTS.md
and keeps the rest of the file byte for byte. Pure."""

from __future__ import annotations

from collections.abc import Iterable


def split_sections(text: str) -> list[tuple[str, str]]:
    """(heading, block) for each `## ` section of a document, in order; the text before
    the first one comes first with heading ""."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        sections[-1][1].append(line)
    return [(heading, "".join(lines)) for heading, lines in sections]


def merge_sections(old: str, new: str, headings: Iterable[str]) -> str:
    """`old` with each `## heading` section named in `headings` taken from `new`.

    A section `old` lacks is inserted before the first section that follows it in `new`
    and exists in `old` (else at the end); one `new` lacks is left as it was in `old`.
    Everything else in `old` is kept byte for byte.
    """
    wanted = set(headings)
    fresh = dict(split_sections(new))
    order = [heading for heading, _ in split_sections(new)]
    merged = [(h, fresh[h] if h in wanted and h in fresh else block)
              for h, block in split_sections(old)]
    present = {h for h, _ in merged}
    for heading in order:
        if heading not in wanted or heading in present:
            continue
        block = fresh[heading]
        later = order[order.index(heading) + 1:]
        at = next((i for i, (h, _) in enumerate(merged) if h in later and h), len(merged))
        if at == len(merged) and merged and not merged[-1][1].endswith("\n\n"):
            block = "\n" + block
        merged.insert(at, (heading, block))
        present.add(heading)
    return "".join(block for _, block in merged)

