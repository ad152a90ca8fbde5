"""How the manual's blocks are read and run (with Sybil: see `manual.py` for why).

- A ```` ```python ```` block is a **sample**: it runs in the page's namespace, after the
  page's earlier blocks, so a page reads top to bottom as one program. Top-level `await`
  works, as in `python -m asyncio`, on the page's loop.
- `<!-- invisible-code-block: python ... -->` is a hidden block: set-up or a check the
  reader does not need to see (a table the sample writes to, a worker run to its end, an
  assertion on what the sample did). It runs like a sample but is not counted as one.
- `<!-- fragment: why -->` before a block says the block is deliberately not a whole
  program (it shows one call inside code the reader already has, say a Django view): it is
  counted as a fragment and not run. A fragment needs its reason.
- A block whose first line names a repository file (`# consumers/mail.py`,
  `# topics/email.send.toml`) must be that file as it is. A TOML block must parse, and one
  naming `topics/<type>.toml` must be a type policy `stream-jobs topics apply` accepts.
- `<!-- skip: next "why" -->` (Sybil's own) skips a block for another reason, e.g. one
  that needs a service the test run does not have.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from unittest import SkipTest

from sybil import Document, Example, Region
from sybil.parsers.markdown import CodeBlockParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

from stream_jobs.job_types import load_job_types
from tests.docs.page import REPO

FRAGMENT = "fragment"
# Sybil tells a hidden block from a fenced one by the lexeme its comment lexer adds.
HIDDEN = "directive"


def is_hidden(example: Example) -> bool:
    """Whether `example` came from an `invisible-code-block` comment."""
    return HIDDEN in (example.region.lexemes or {})


def run_python(example: Example) -> None:
    """Run a Python block in its page's namespace; top-level awaits on the page's loop."""
    __tracebackhide__ = True
    check_named_file(example)
    namespace: dict[str, Any] = example.namespace
    source = "\n" * (example.line + example.parsed.line_offset) + example.parsed
    code = compile(source, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                   dont_inherit=True)
    if code.co_flags & inspect.CO_COROUTINE:
        namespace["page"].run(eval(code, namespace))
    else:
        exec(code, namespace)
    namespace.pop("__builtins__", None)


def python_samples() -> CodeBlockParser:
    """Fenced and hidden Python blocks, run by `run_python` (Sybil's own evaluator has no
    top-level await, and the manual's samples are mostly async)."""
    return CodeBlockParser(language="python", evaluator=run_python)


class Fragments:
    """`<!-- fragment: why -->`: the next block is counted as a fragment and not run."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive=FRAGMENT)

    def __call__(self, document: Document) -> Iterable[Region]:
        for lexed in self.lexer(document):
            reason = (lexed.lexemes.get("arguments") or "").strip()
            if not reason:
                raise ValueError(f"{document.path}: a fragment says why it is one: "
                                 "<!-- fragment: why -->")
            yield Region(lexed.start, lexed.end, reason, self.mark_next)

    @staticmethod
    def mark_next(example: Example) -> None:
        example.document.push_evaluator(SkipNext(f"{FRAGMENT}: {example.parsed}"))


class SkipNext:
    """An evaluator that skips the next block with `reason`, then steps aside."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __call__(self, example: Example) -> None:
        example.document.pop_evaluator(self)
        raise SkipTest(self.reason)


# -- a block that names its file is that file ----------------------------------------------

NAMED = re.compile(r"^# (?P<path>[\w./-]+\.(?:py|toml))$")


def named_file(source: str) -> str | None:
    """The repository path a block names on its first line (`# consumers/mail.py`)."""
    first = source.split("\n", 1)[0].strip()
    found = NAMED.match(first)
    return found.group("path") if found else None


def check_named_file(example: Example) -> None:
    """A block that names a file of the repository shows that file as it is (the reader
    copies it, or runs the file the page says to run); a diff says where they part."""
    source = str(example.parsed)
    name = named_file(source)
    if name is None or not (REPO / name).is_file():
        return
    actual = (REPO / name).read_text()
    if source == actual:
        return
    diff = "".join(difflib.unified_diff(source.splitlines(keepends=True),
                                        actual.splitlines(keepends=True),
                                        f"{Path(example.path).name} line {example.line}",
                                        name))
    raise AssertionError(f"The block names {name} but is not that file as it is:\n{diff}")


def check_toml(example: Example) -> None:
    """A TOML block is valid TOML; one that names `topics/<type>.toml` is a valid type
    policy (as `stream-jobs topics apply` reads it); one naming a repository file is it."""
    __tracebackhide__ = True
    check_named_file(example)
    source = str(example.parsed)
    tomllib.loads(source)
    name = named_file(source)
    if name is not None and Path(name).parent.name == "topics":
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / Path(name).name).write_text(source)
            load_job_types(Path(folder))


def toml_samples() -> CodeBlockParser:
    return CodeBlockParser(language="toml", evaluator=check_toml)


# -- the reader's own project: the files a page shows that the repository does not have ----

FENCE = re.compile(r"^```[\w-]*\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
# `# myapp/signup.py`, or `# pyproject.toml (your project's)` for a name the repository has.
PROJECT_FILE = re.compile(r"^# (?P<path>[\w./-]+\.\w+)(?: \(.+\))?$")


def section_of(text: str, heading: str) -> str:
    """The part of a page from the line `heading` to the next heading of its level or
    above (the page's end if none); a `#` line in a fenced block or a comment is none."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines(keepends=True)
    start = lines.index(f"{heading}\n")
    inside: str | None = None  # the line that ends the block or comment we are in
    for end in range(start + 1, len(lines)):
        line = lines[end]
        if inside is not None:
            if line.rstrip().endswith(inside):
                inside = None
        elif line.startswith("```"):
            inside = "```"
        elif line.startswith("<!--") and not line.rstrip().endswith("-->"):
            inside = "-->"
        elif re.match(rf"#{{1,{level}}} ", line):
            return "".join(lines[start:end])
    return "".join(lines[start:])


def project_files(page: Path, heading: str | None = None) -> dict[str, str]:
    """The files of the reader's project that `page` shows (in the section under `heading`,
    if given): each block whose first line names a file the repository does not have
    (`# myapp/signup.py`), or names one with a note (`# pyproject.toml (yours)`)."""
    text = page.read_text()
    if heading is not None:
        text = section_of(text, heading)
    files = {}
    for found in FENCE.finditer(text):
        body = found.group("body")
        first = PROJECT_FILE.match(body.split("\n", 1)[0].strip())
        if first is None:
            continue
        name = named_file(body)
        if name is not None and (REPO / name).is_file():
            continue  # a repository file (checked by check_named_file), not the reader's
        files[first.group("path")] = body
    return files


def write_project(folder: Path, files: dict[str, str]) -> Path:
    """Write `files` (as `project_files` gives them) under `folder`; returns `folder`."""
    for name, body in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return folder
