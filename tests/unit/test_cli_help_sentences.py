"""Every `--help` reads as sentences (issue 26): the line breaks of a docstring wrapped in
the source never reach the terminal; only the renderer wraps, to the terminal's width.

Rendered at 500 columns, where the renderer wraps nothing, each paragraph of every help
text (a command's, each of its arguments' and options', and each first paragraph a group
lists its commands by) must stand on one line."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import typer
from rich.text import Text
from typer.testing import CliRunner

from stream_jobs.cli import app
from stream_jobs.cli.common import flowing
from tests.unit.test_cli_help import ALL

BORDERS = re.compile(r"[│╭╮╰╯─]")


def _command(path: tuple[str, ...]) -> Any:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def _paragraphs(text: str) -> list[str]:
    """The paragraphs as the reader sees them: markup gone, spaces as one."""
    plain = Text.from_markup(inspect.cleandoc(text).partition("\f")[0]).plain
    return [" ".join(part.split()) for part in plain.split("\n\n") if part.strip()]


def _lines(output: str) -> list[str]:
    return [" ".join(BORDERS.sub(" ", line).split()) for line in output.splitlines()]


@pytest.mark.parametrize("path", [(), *ALL], ids=lambda path: " ".join(path) or "root")
def test_each_help_paragraph_is_one_line_at_500_columns(path: tuple[str, ...]) -> None:
    command = _command(path)
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "500"})
    assert shown.exit_code == 0, shown.output
    lines = _lines(shown.output)
    texts = [command.help or ""] + [getattr(param, "help", None) or ""
                                   for param in command.params]
    # A group lists its commands by the first paragraph of each one's help.
    texts += [_paragraphs(sub.help or "")[0] for sub in getattr(command, "commands", {}).values()
              if not sub.hidden and sub.help]
    for text in texts:
        for paragraph in _paragraphs(text):
            assert any(paragraph in line for line in lines), (
                f"`{' '.join(path)} --help` breaks this paragraph over lines:\n{paragraph}\n"
                f"---\n{shown.output}")


@pytest.mark.parametrize("path", [(), *ALL], ids=lambda path: " ".join(path) or "root")
def test_help_fits_80_columns(path: tuple[str, ...]) -> None:
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    assert max(len(line) for line in shown.output.splitlines()) <= 80, shown.output


def test_flowing_joins_lines_and_keeps_paragraphs() -> None:
    source = """First line
        goes on here.

        Second paragraph,
        also joined.
        """
    assert flowing(source) == "First line goes on here.\n\nSecond paragraph, also joined."
    assert flowing("\bkept\nas is\n\nyes\nno") == "\bkept\nas is\n\nyes no"
    assert flowing(flowing(source)) == flowing(source)
