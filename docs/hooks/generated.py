"""The manual's generated parts, made when mkdocs builds the site (`hooks:` in mkdocs.yml).

Pages copied in from outside `docs/`: the README is the home page (its links into
`docs/` made relative to the site), and the RESULTS.md files of the benchmarks and the
fault injection are pages of their own, as their runs last wrote them. A page's
`<!-- generated: NAME -->` marker is replaced with what generator NAME returns: the
settings from the pydantic model, the CLI reference from the typer app, the code layout
from the import-linter contract. So none of them can drift from the code.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import cli_page
import layout_page
import settings_page
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")

GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_page.settings_reference,
    "cli": cli_page.cli_reference,
    "code-layout": lambda: layout_page.code_layout(REPO / "pyproject.toml"),
    "feature-folders": lambda: layout_page.feature_folders(REPO),
}

# Site page -> (file in the repository, what the page is).
COPIED = {
    "performance/results.md": ("ops/bench/RESULTS.md", "as `make bench` last wrote it"),
    "faults/results.md": ("ops/chaos/RESULTS.md", "as `make chaos` last wrote it"),
    "faults/results-100k.md": ("ops/chaos/RESULTS-100k.md",
                               "as `CHAOS_JOBS=100000 make chaos` last wrote it"),
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the pages made from files outside `docs/`."""
    readme = (REPO / "README.md").read_text()
    files.append(File.generated(config, "index.md", content=readme.replace("](docs/", "](")))
    for page, (source, note) in COPIED.items():
        text = (REPO / source).read_text()
        files.append(File.generated(config, page, content=_with_note(text, source, note)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Fill the page's generated parts."""

    def fill(marker: re.Match[str]) -> str:
        generator = GENERATORS.get(marker.group(1))
        if generator is None:
            raise PluginError(f"{page.file.src_uri}: no generator named {marker.group(1)!r} "
                              f"(there are: {', '.join(GENERATORS)})")
        return generator()

    return MARKER.sub(fill, markdown)


def _with_note(text: str, source: str, note: str) -> str:
    """`text` with a line under its title saying where the page comes from."""
    title, _, rest = text.partition("\n")
    line = f"*This page is `{source}`, {note}.*"
    if not title.startswith("# "):
        return f"{line}\n\n{text}"
    return f"{title}\n\n{line}\n{rest}"
