"""The manual's generated parts, made when mkdocs builds the site (`hooks:` in mkdocs.yml).

Pages copied in from outside `docs/`: the README is the home page (its links into
`docs/` made relative to the site), and the RESULTS.md files of the benchmarks and the
fault injection are pages of their own, as their runs last wrote them.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]

# Site page -> (file in the repository, what the page is).
COPIED = {
    "performance/results.md": ("ops/bench/RESULTS.md", "as `make bench` last wrote it"),
    "faults/results.md": ("ops/chaos/RESULTS.md", "as `make chaos` last wrote it"),
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the pages made from files outside `docs/`."""
    readme = (REPO / "README.md").read_text()
    files.append(File.generated(config, "index.md", content=readme.replace("](docs/", "](")))
    for page, (source, note) in COPIED.items():
        text = (REPO / source).read_text()
        files.append(File.generated(config, page, content=_with_note(text, source, note)))
    return files


def _with_note(text: str, source: str, note: str) -> str:
    """`text` with a line under its title saying where the page comes from."""
    title, _, rest = text.partition("\n")
    line = f"*This page is `{source}`, {note}.*"
    if not title.startswith("# "):
        return f"{line}\n\n{text}"
    return f"{title}\n\n{line}\n{rest}"
