"""The `stream-jobs` command. Each command group lives in its own module; this one wires them.

A `StreamJobsError` becomes one red sentence and exit code 1, never a traceback.
"""

from __future__ import annotations

import logging
import sys

import typer
from rich.console import Console
from rich.markup import escape

from stream_jobs.cli import cancel as _cancel  # noqa: F401 - registers `cancel`
from stream_jobs.cli import demo as _demo  # noqa: F401 - registers `demo`
from stream_jobs.cli import enqueue as _enqueue  # noqa: F401 - registers `enqueue`
from stream_jobs.cli import flow as _flow  # noqa: F401 - registers `throttle`, `drain`
from stream_jobs.cli import history as _history  # noqa: F401 - registers `history`
from stream_jobs.cli import retry_now as _retry_now  # noqa: F401 - registers `retry-now`
from stream_jobs.cli import running as _running  # noqa: F401 - registers `running`, `workers`
from stream_jobs.cli import schedules as _schedules  # registers `scheduler`
from stream_jobs.cli import serve as _serve  # noqa: F401 - registers `serve`
from stream_jobs.cli import waiting as _waiting  # noqa: F401 - registers `waiting`
from stream_jobs.cli import worker as _worker  # noqa: F401 - registers `worker`
from stream_jobs.cli.batch import batch
from stream_jobs.cli.common import app, flow_help
from stream_jobs.cli.db import db_app
from stream_jobs.cli.dev import dev_app
from stream_jobs.cli.dlq import dlq_app
from stream_jobs.cli.outbox import outbox_app
from stream_jobs.cli.replay import offsets_app, replay_command
from stream_jobs.cli.stats import job, stats
from stream_jobs.cli.topics import topics_app
from stream_jobs.errors import ConfigError, StreamJobsError
from stream_jobs.redaction import redact_text
from stream_jobs.settings import Settings, load_settings
from stream_jobs.tracing.setup import configure_from_env

app.add_typer(dev_app, name="dev")
app.add_typer(topics_app, name="topics")
app.add_typer(db_app, name="db")
app.add_typer(dlq_app, name="dlq")
app.add_typer(outbox_app, name="outbox")
app.add_typer(offsets_app, name="offsets")
app.add_typer(_schedules.schedules_app, name="schedules")
app.command("replay")(replay_command)
app.command("stats")(stats)
app.command("job")(job)
app.command("batch")(batch)
# Last, once every command is registered: help texts as sentences, not source lines.
flow_help(app)

err_console = Console(stderr=True)


def _quiet_driver_logs() -> None:
    # aiokafka logs every failed connection and metadata miss; with no logging configured
    # Python prints those next to the one sentence the CLI reports instead. The worker
    # command configures logging and turns them back on.
    driver = logging.getLogger("aiokafka")
    driver.addHandler(logging.NullHandler())
    driver.propagate = False


def _settings_or_none() -> Settings | None:
    """The environment's settings, whose secrets an error must not show; None when the
    environment is what the error is about."""
    try:
        return load_settings()
    except ConfigError:
        return None


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script."""
    _quiet_driver_logs()
    configure_from_env()  # traces, when OTEL_TRACES_EXPORTER asks for them (docs/tracing.md)
    try:
        # Without standalone mode typer returns the code of typer.Exit (and 130 for
        # Ctrl-C) instead of exiting with it.
        code = app(args=argv, standalone_mode=False)
    except StreamJobsError as exc:
        # escape: a message may quote TOML ("[[schedules]]"), which is not markup
        shown = redact_text(str(exc), _settings_or_none())
        err_console.print(f"[bold red]error:[/] {escape(shown)}", highlight=False,
                          soft_wrap=True)
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
    if isinstance(code, int) and code != 0:
        sys.exit(code)


__all__ = ["app", "main"]
