"""Every command's `--help` reads as written for people: no Python type where a metavar
belongs (issue 22 found `--type <list[str]>`), and every option says what it does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from stream_jobs.cli import app


# typer carries its own copy of click: its classes are read by what they have.
def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if hasattr(group, "commands"):
        for name, command in group.commands.items():
            yield from commands(command, (*path, name))
    else:
        yield path


ALL = sorted(commands(typer.main.get_command(app)))


def test_every_command_is_walked() -> None:
    assert ("worker",) in ALL
    assert ("dlq", "requeue") in ALL
    assert len(ALL) > 30


@pytest.mark.parametrize("path", ALL, ids=" ".join)
def test_help_shows_no_python_types_and_every_option_has_help(path: tuple[str, ...]) -> None:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    text = shown.output
    assert "<list[" not in text, text
    assert "[str]" not in text, text
    for param in command.params:
        if param.param_type_name == "option" and not param.hidden:
            assert param.help, f"{' '.join(path)} {param.opts[0]} has no help"
