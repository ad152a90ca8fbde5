"""The CLI reference: every `stream-jobs` command's usage, arguments, options and help,
read from the typer app, so the page says what `--help` says."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import typer
from page_text import code, inline, paragraphs, table

from stream_jobs.cli import app

ROOT = "stream-jobs"


@dataclass(frozen=True)
class Parameter:
    """One argument or option as `--help` lists it."""

    declaration: str  # "--type, -t <str>", or an argument's usage piece, "{TYPE}"
    help: str  # with typer's notes: "[env var: ...; default: ...]", "[required]"
    envvar: str | None


@dataclass(frozen=True)
class Command:
    """One command or command group."""

    words: tuple[str, ...]  # ("stream-jobs", "dlq", "requeue")
    usage: str
    help: str
    arguments: tuple[Parameter, ...]
    options: tuple[Parameter, ...]
    subcommands: tuple[tuple[str, str], ...]  # (name, first line of its help)

    @property
    def name(self) -> str:
        return " ".join(self.words)

    @property
    def anchor(self) -> str:
        """The id of this command's heading on the page."""
        return anchor(self.name)


def anchor(name: str) -> str:
    """The id Markdown's table of contents gives the heading `## stream-jobs dlq list`
    (command names are lowercase words; mkdocs --strict checks links to these)."""
    return name.lower().replace(" ", "-")


def commands() -> list[Command]:
    """Every command, depth first in the order `--help` lists them; the root first."""
    # typer ships its own copy of click's classes; only their public methods are used here.
    root: Any = typer.main.get_command(app)
    return list(_walk(root, root.context_class(root, info_name=ROOT), (ROOT,)))


def cli_reference() -> str:
    """The whole reference as Markdown: a section per command, groups above their commands."""
    return "\n\n".join(_section(command) for command in commands())


def option_envvars() -> dict[str, list[Command]]:
    """Environment variable -> the commands with an option that reads it."""
    found: dict[str, list[Command]] = {}
    for command in commands():
        for option in command.options:
            if option.envvar:
                found.setdefault(option.envvar, []).append(command)
    return found


def _walk(command: Any, ctx: Any, words: tuple[str, ...]) -> Iterator[Command]:
    if command.hidden:
        return
    arguments: list[Parameter] = []
    options: list[Parameter] = []
    for param in command.get_params(ctx):
        if param.hidden or param.name == "help":
            continue
        if param.param_type_name == "argument":
            notes = " [required]" if param.required else ""
            arguments.append(Parameter(" ".join(param.get_usage_pieces(ctx)),
                                       (getattr(param, "help", None) or "") + notes, None))
        else:
            declaration, help_text = param.get_help_record(ctx)
            envvar = param.envvar if isinstance(param.envvar, str) else None
            options.append(Parameter(declaration, help_text, envvar))
    names = list(command.list_commands(ctx)) if hasattr(command, "list_commands") else []
    children = [(name, command.get_command(ctx, name)) for name in names]
    children = [(name, child) for name, child in children if not child.hidden]
    yield Command(
        words=words,
        usage=command.get_usage(ctx).removeprefix("Usage: "),
        help=command.help or "",
        arguments=tuple(arguments),
        options=tuple(options),
        subcommands=tuple((name, _summary(child.help)) for name, child in children),
    )
    for name, child in children:
        yield from _walk(child, child.context_class(child, info_name=name, parent=ctx),
                         (*words, name))


def _section(command: Command) -> str:
    level = "###" if len(command.words) > 2 else "##"
    parts = [f"{level} {command.name}", f"```text\n{command.usage}\n```"]
    if command.help:
        parts.append(paragraphs(command.help))
    if command.subcommands:
        parts.append(table(["command", "what it does"], [
            [f"[{code(f'{command.name} {name}')}](#{anchor(f'{command.name} {name}')})",
             inline(summary)] for name, summary in command.subcommands]))
    if command.arguments:
        parts.append(table(["argument", "what it is"], [[code(a.declaration), inline(a.help)]
                                              for a in command.arguments]))
    if command.options:
        parts.append(table(["option", "what it does"], [[code(o.declaration), inline(o.help)]
                                            for o in command.options]))
    return "\n\n".join(parts)


def _summary(text: str | None) -> str:
    return (text or "").strip().split("\n\n", 1)[0]
