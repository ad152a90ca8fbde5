"""The `stream-jobs` command. Each command group lives in its own module; this one wires them.

A `StreamJobsError` becomes one red sentence and exit code 1, never a traceback.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from stream_jobs.cli.common import app
from stream_jobs.cli.dev import dev_app
from stream_jobs.cli.topics import topics_app
from stream_jobs.cli.worker import db_app
from stream_jobs.errors import StreamJobsError

app.add_typer(dev_app, name="dev")
app.add_typer(topics_app, name="topics")
app.add_typer(db_app, name="db")

err_console = Console(stderr=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script."""
    try:
        app(args=argv, standalone_mode=False)
    except StreamJobsError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: bad option, missing argument
        show = getattr(exc, "show", None)
        if show is None:
            raise
        show()
        sys.exit(int(getattr(exc, "exit_code", 2)))


__all__ = ["app", "main"]
