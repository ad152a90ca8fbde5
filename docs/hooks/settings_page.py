"""The settings reference: every field of `stream_jobs.settings.Settings` as its environment
variable, type, default and comment, read from the model and from its source.

The model's fields carry no descriptions; their comments in `stream_jobs/settings.py` do
that job. A comment belongs to the field right below it, except that a comment opening a
blank-line-separated run of several fields introduces the run as a whole (as "Kafka
security (...)" does there). A field's `description=`, where one is given, wins.
"""

from __future__ import annotations

import ast
import inspect
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from cli_page import Command, anchor, option_envvars
from page_text import code, inline, paragraphs, table
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from stream_jobs.settings import Settings

# Constraint attributes of pydantic's field metadata, as a reader writes them.
BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


@dataclass
class Group:
    """Fields that stand together in the model's source, and the comment introducing them."""

    intro: str | None
    fields: list[tuple[str, str | None]] = field(default_factory=list)  # (name, comment)


def settings_reference() -> str:
    """The tables of settings, then the environment variables only commands read."""
    prefix = Settings.model_config.get("env_prefix", "")
    commands = option_envvars()
    parts: list[str] = []
    for group in groups(Settings):
        if group.intro:
            parts.append(paragraphs(group.intro))
        rows = []
        for name, comment in group.fields:
            info = Settings.model_fields[name]
            variable = f"{prefix}{name}".upper()
            about = inline(info.description or comment or "")
            options = _options(commands.get(variable, []), variable)
            also = f"Option: {options}." if options else ""
            rows.append([code(variable), _type(info), _default(info),
                         " ".join(part for part in (about, also) if part)])
        parts.append(table(["variable", "type", "default", "what it is"], rows))
    settings = {f"{prefix}{name}".upper() for name in Settings.model_fields}
    others = sorted(set(commands) - settings)
    if others:
        parts.append("These environment variables are read by command options, not by the "
                     "settings model:")
        parts.append(table(["variable", "option"], [[code(variable), _options(commands[variable],
                                                                             variable)]
                                                    for variable in others]))
    return "\n\n".join(parts)


def groups(model: type[Settings]) -> list[Group]:
    """The model's fields in source order, grouped as their comments and blank lines say."""
    lines = inspect.getsource(model).splitlines()
    [klass] = ast.parse("\n".join(lines)).body
    assert isinstance(klass, ast.ClassDef)
    runs: list[list[tuple[str, list[str], bool]]] = []  # (name, comment lines, opens a run)
    for node in klass.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id in model.model_fields):
            continue
        comment, above = _comment_above(lines, node.lineno - 1)
        opens = above < 0 or not lines[above].strip() or not runs
        if opens:
            runs.append([])
        runs[-1].append((node.target.id, comment, opens))
    result: list[Group] = []
    for run in runs:
        first_comment = run[0][1]
        intro = " ".join(first_comment) if first_comment and len(run) > 1 else None
        fields = [(name, None if intro and i == 0 else (" ".join(comment) or None))
                  for i, (name, comment, _) in enumerate(run)]
        if intro is None and result and result[-1].intro is None:
            result[-1].fields.extend(fields)  # runs without an introduction share a table
        else:
            result.append(Group(intro, fields))
    return result


def _comment_above(lines: list[str], index: int) -> tuple[list[str], int]:
    """The comment lines right above line `index` (0-based), and the index of the line
    above them."""
    above = index - 1
    comment: list[str] = []
    while above >= 0 and lines[above].strip().startswith("#"):
        comment.insert(0, lines[above].strip().lstrip("#").strip())
        above -= 1
    return comment, above


def _type(info: FieldInfo) -> str:
    text = _annotation(info.annotation)
    bounds = [f"{sign} {getattr(rule, name)}" for rule in info.metadata
              for name, sign in BOUNDS if getattr(rule, name, None) is not None]
    return inline(", ".join([text, *bounds]))


def _annotation(annotation: object) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(f"`{arg}`" for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_annotation(arg) for arg in args if arg is not type(None))
    if origin in (tuple, list):
        return f"JSON list ({', '.join(_annotation(arg) for arg in args)})"
    if annotation is SecretStr:
        return "secret"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, Path):
        home = Path.home()
        if home != Path(home.anchor) and value.is_relative_to(home):
            return code(str(Path("~") / value.relative_to(home)))  # not the builder's home
        return code(str(value))
    if isinstance(value, tuple | list):
        return code(json.dumps(list(value)))
    return code(str(value))


def _options(commands: list[Command], variable: str) -> str:
    """Where the variable is also an option: `stream-jobs worker --metrics-port`."""
    found = []
    for command in commands:
        for option in command.options:
            if option.envvar == variable:
                flag = _long_flag(option.declaration)
                found.append(f"[{code(f'{command.name} {flag}')}](cli.md#{anchor(command.name)})")
    return ", ".join(found)


def _long_flag(declaration: str) -> str:
    """`--type` of "-t, --type <str>"."""
    words = declaration.replace(",", " ").split()
    return next((word for word in words if word.startswith("--")), words[0])
