"""`stream-jobs dev up|down|status|check`: the local Kafka + Postgres stack, and the history
process of the settings' topic prefix."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console
from rich.table import Table

from stream_jobs.cli.common import settings_of
from stream_jobs.cli.db import migrated
from stream_jobs.errors import StreamJobsError
from stream_jobs.plurals import counted
from stream_jobs.postgres.migrate import migrate
from stream_jobs.redaction import redact_url
from stream_jobs.stack import HistoryProcess, KafkaCluster, PostgresServer, ServiceStatus
from stream_jobs.tools.probe import probe_stack

dev_app = typer.Typer(help="Run a real Kafka and Postgres locally, and the history process "
                      "(development and tests).",
                      no_args_is_help=True)
console = Console()


@dev_app.command("up")
def up(
    ctx: typer.Context,
    brokers: int = typer.Option(1, "--brokers", help="1 broker, or a 3-node KRaft cluster."),
    postgres: bool = typer.Option(True, "--postgres/--no-postgres", help="Also start Postgres."),
    history: bool = typer.Option(
        True, "--history/--no-history",
        help="Also run `stream-jobs history` for the prefix and schema (needs Postgres)."),
) -> None:
    """Start the stack (idempotent), wait until it answers, migrate the schema as `db
    migrate` does, start the history process of the prefix in the background, then print
    how to connect."""
    settings = settings_of(ctx)
    if brokers not in (1, 3):
        raise typer.BadParameter("use --brokers 1 or --brokers 3", param_hint="--brokers")
    kafka = KafkaCluster(settings, brokers)
    with console.status(f"starting {kafka.name} ({counted(brokers, 'broker')})"):
        kafka.up()
    services = kafka.status()
    migration = None
    if postgres:
        server = PostgresServer(settings)
        with console.status("starting postgres"):
            server.up()
            migration = asyncio.run(migrate(settings.model_copy(
                update={"database_url": server.dsn})))
        services.append(server.status())
        if history:
            process = HistoryProcess(settings)
            with console.status(f"starting the history of prefix {process.prefix}"):
                process.up(kafka.bootstrap, server.dsn)
            services.append(process.status())
    _print_table(services)
    if migration is not None:
        console.print(migrated(migration), highlight=False, soft_wrap=True)


@dev_app.command("down")
def down(ctx: typer.Context) -> None:
    """Stop every service of the stack that we started (data folders are kept)."""
    settings = settings_of(ctx)
    # The history processes first, while the broker they commit to still answers.
    stopped = [name for process in HistoryProcess.known(settings) for name in process.down()]
    stopped += [*KafkaCluster(settings, 1).down(), *KafkaCluster(settings, 3).down(),
                *PostgresServer(settings).down()]
    # One line at any width: the history processes made it longer than a terminal.
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"),
                  soft_wrap=True, highlight=False)


@dev_app.command("status")
def status(ctx: typer.Context) -> None:
    """What runs, where, how to connect, and where each service logs."""
    settings = settings_of(ctx)
    rows = [*KafkaCluster(settings, 1).status(), *KafkaCluster(settings, 3).status(),
            PostgresServer(settings).status(),
            *(process.status() for process in HistoryProcess.known(settings))]
    _print_table(rows)


@dev_app.command("check")
def check(ctx: typer.Context) -> None:
    """Connect to the configured Kafka and Postgres and say whether each answers."""
    settings = settings_of(ctx)
    results = asyncio.run(probe_stack(settings))
    table = Table(title="stream-jobs connections")
    for column in ("service", "address", "state", "detail"):
        table.add_column(column, overflow="fold")
    configured = (settings.kafka_bootstrap, redact_url(settings.database_url))
    for service, address, result in zip(("kafka", "postgres"), configured, results, strict=True):
        if isinstance(result, StreamJobsError):
            table.add_row(service, address, "[red]no answer[/]", type(result).__name__)
        else:
            table.add_row(service, address, "[green]answers[/]", result.detail)
    console.print(table)
    for result in results:
        if isinstance(result, StreamJobsError):
            raise result


def stack_table(rows: list[ServiceStatus]) -> Table:
    table = Table(title="stream-jobs local stack")
    for column in ("service", "state", "pid", "address"):
        table.add_column(column, overflow="fold")
    for row in rows:
        state = "[green]running[/]" if row.running else "[dim]stopped[/]"
        table.add_row(row.name, state, str(row.pid or "-"), row.address)
    return table


def _print_table(rows: list[ServiceStatus]) -> None:
    console.print(stack_table(rows))
    # Settings and paths as plain lines, never folded, so they can be copied at any width.
    shown: set[str] = set()
    for row in rows:
        if row.running and row.connect not in shown:  # a cluster's nodes share one
            shown.add(row.connect)
            console.print(f"connect: {row.connect}", soft_wrap=True, highlight=False)
    for row in rows:
        console.print(f"log: {row.name}: {row.log}", soft_wrap=True, highlight=False)
