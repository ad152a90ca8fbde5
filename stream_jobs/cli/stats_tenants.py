"""`stream-jobs stats TYPE --tenants`: one type's top tenants by jobs waiting, in the
overflow lane and in flight, with their p95 dwell (docs/fairness.md), as a table that
fits 80 columns, or one JSON document."""

from __future__ import annotations

from rich.console import Console, Group
from rich.markup import escape

from stream_jobs.cli.tables import FittedTable, number_column, text_column
from stream_jobs.errors import ConfigError
from stream_jobs.fairness.census import TenantCensus
from stream_jobs.fairness.tally import TenantFigures
from stream_jobs.plurals import counted

_COLUMNS = (text_column("tenant"), number_column("waiting"), number_column("overflow"),
            number_column("in flight"), number_column("dwell p95"))


def checked_tenants(job_type: str | None, *, watch: bool, partitions: bool,
                    history: str | None) -> str:
    """The type asked for, or a ConfigError saying what is wrong with the command."""
    if job_type is None:
        raise ConfigError("--tenants shows one type: `stream-jobs stats TYPE --tenants`.")
    if watch or partitions or history is not None:
        raise ConfigError("--tenants reads a type's tenants once: drop --watch, "
                          "--partitions and --history.")
    return job_type


def tenant_name(tenant: str) -> str:
    """How a tenant is shown: jobs of no tenant as "(none)"."""
    return tenant if tenant else "(none)"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:g}ms" if value < 1 else f"{value:g}s"


def _cells(figures: TenantFigures, *, at_least: bool) -> list[str]:
    more = "+" if at_least else ""
    return [f"{figures.waiting:,}{more}", f"{figures.overflow:,}{more}",
            f"{figures.in_flight:,}", _seconds(figures.dwell_p95_s)]


def render_tenants(census: TenantCensus, *, wide: bool = False) -> Group:
    at_least = not census.complete
    table = FittedTable(_COLUMNS, wide=wide, title=f"tenants of {census.job_type}: "
                        f"{counted(census.tenants, 'tenant')} seen, "
                        f"{counted(census.workers, 'live worker')}")
    for name, figures in census.top:
        table.add_row(escape(tenant_name(name)), *_cells(figures, at_least=at_least))
    rest = census.tenants - len(census.top)
    if rest > 0 or census.other.jobs or any(census.other.dwells):
        table.add_row(f"[i]other ({counted(max(rest, 0), 'tenant')})[/]",
                      *_cells(census.other, at_least=at_least))
    table.add_row("[b]all[/]", *_cells(census.total, at_least=at_least), end_section=True)
    notes: list[str] = []
    if at_least:
        notes.append(f"[yellow]The scan stopped at its bound of {census.max_records:,} "
                     "records: waiting and overflow are at least these counts.[/]")
    notes.append("[dim]waiting: past the worker group's committed offsets (in flight "
                 "included); in flight and dwell p95: from the live workers' reports.[/]")
    return Group(table, *notes)


def print_tenants(console: Console, census: TenantCensus, *, wide: bool) -> None:
    console.print(render_tenants(census, wide=wide), crop=not wide)


__all__ = ["checked_tenants", "print_tenants", "render_tenants", "tenant_name"]
