"""The code layout: the layers of the import-linter contract in pyproject.toml, top to
bottom, grouped in the bands its comments name, with each module's docstring summary;
and which folders and files hold each feature. Modules are read as files, not imported."""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from page_text import code, inline, table


@dataclass(frozen=True)
class Module:
    """A module or package of a layer, named relative to its container (`kafka/scan.py`)."""

    name: str
    summary: str


@dataclass(frozen=True)
class Layer:
    """One entry of the contract's `layers`: sibling modules, independent if joined by `|`."""

    spec: str  # as the contract writes it: "tools | dlq | stack"
    modules: tuple[Module, ...]
    band: str  # the contract's comment above it: "operator tools"


def code_layout(pyproject: Path) -> str:
    """The layers contract of `pyproject`, as a table of layers, modules and summaries."""
    container, layers, ignored = read_contract(pyproject)
    rows = []
    band = ""
    for number, layer in enumerate(layers, 1):
        for i, module in enumerate(layer.modules):
            shown_band = f"**{layer.band}**" if layer.band != band else ""
            band = layer.band
            rows.append([shown_band, f"{number}. {inline(layer.spec)}" if i == 0 else "",
                         code(module.name), inline(module.summary)])
    parts = [table(["band", "layer", "module", "what it is"], rows)]
    unlisted = _unlisted(container, layers, ignored)
    if ignored:
        parts.append(f"Left out of the contract on purpose: {', '.join(map(code, ignored))}.")
    if unlisted:
        parts.append(f"In no layer yet: {', '.join(map(code, unlisted))}.")
    return "\n\n".join(parts)


def read_contract(pyproject: Path) -> tuple[Path, list[Layer], list[str]]:
    """The container's folder, its layers top to bottom, and the modules the contract
    ignores (`exhaustive_ignores`)."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    [container] = contract.get("containers", [config.get("root_package")])
    folder = pyproject.parent / container.replace(".", "/")
    bands = _bands(pyproject.read_text(), contract["name"])
    layers = []
    for spec in contract["layers"]:
        names = [name.strip(" ()") for name in re.split(r"[|:]", spec)]
        modules = tuple(module for name in names if name for module in _modules(folder, name))
        layers.append(Layer(" ".join(spec.split()), modules, bands.get(spec, "")))
    return folder, layers, list(contract.get("exhaustive_ignores", []))


def _bands(text: str, contract_name: str) -> dict[str, str]:
    """Each layer's band: the `# name` comment above it in the contract's `layers` list
    (TOML drops comments, so the list is read as text)."""
    start = text.index(f'name = "{contract_name}"')
    body = text[text.index("layers = [", start):]
    body = body[:body.index("\n]")]
    bands: dict[str, str] = {}
    band = ""
    for line in body.splitlines()[1:]:
        line = line.strip()
        if line.startswith("#"):
            band = line.lstrip("# ")
        elif line.startswith('"'):
            bands[line.rstrip(",").strip('"')] = band
    return bands


# Feature -> the words its files are named by, outside its folder.
FEATURES = {
    "cancels": ("cancel", "control"),
    "unique": ("unique", "debounce", "control"),
    "results": ("result",),
    "outbox": ("outbox",),
    "workflows": ("workflow", "batch", "chain"),
    "schedules": ("schedule", "periodic"),
}


def feature_folders(repo: Path) -> str:
    """Where each feature lives: its folder under `stream_jobs/`, then the files elsewhere
    named after it (the CLI's and tools' faces, its docs page, its tests)."""
    rows = []
    for feature, words in FEATURES.items():
        folder = repo / "stream_jobs" / feature
        inside = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
        elsewhere = [p.relative_to(repo).as_posix()
                     for top in ("stream_jobs", "docs", "tests")
                     for p in sorted((repo / top).rglob("*"))
                     if p.suffix in (".py", ".md") and folder not in p.parents
                     and "hooks" not in p.parts and _named_after(p, words)]
        rows.append([code(f"stream_jobs/{feature}/"), ", ".join(map(code, inside)),
                     ", ".join(map(code, elsewhere))])
    return table(["feature", "its folder", "elsewhere (faces, docs, tests)"], rows)


def _named_after(path: Path, words: tuple[str, ...]) -> bool:
    first = re.split(r"[_-]", path.stem.removeprefix("test_"))[0]
    return first.startswith(words)


def _modules(folder: Path, name: str) -> list[Module]:
    path = folder / name.replace(".", "/")
    if path.with_suffix(".py").is_file():
        file = path.with_suffix(".py")
        return [Module(file.relative_to(folder).as_posix(), summary(file))]
    if not (path / "__init__.py").is_file():
        return [Module(name, "(no such module)")]
    found = [Module(f"{path.relative_to(folder).as_posix()}/", summary(path / "__init__.py"))]
    for file in sorted(path.rglob("*.py")):
        if file.name == "__init__.py" and file.parent == path:
            continue
        shown = (f"{file.parent.relative_to(folder).as_posix()}/" if file.name == "__init__.py"
                 else file.relative_to(folder).as_posix())
        found.append(Module(shown, summary(file)))
    return found


def summary(file: Path) -> str:
    """The first paragraph of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(file.read_text()))
    if not doc:
        return "(no docstring)"
    return " ".join(doc.split("\n\n", 1)[0].split())


def _unlisted(folder: Path, layers: list[Layer], ignored: list[str]) -> list[str]:
    """Top-level modules of the container that no layer names."""
    listed = {module.name.split("/", 1)[0].removesuffix(".py")
              for layer in layers for module in layer.modules}
    present = {path.stem for path in folder.glob("*.py") if path.name != "__init__.py"}
    present |= {path.parent.name for path in folder.glob("*/__init__.py")}
    return sorted(present - listed - set(ignored))
