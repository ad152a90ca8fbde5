"""`stream-jobs throttle TYPE --tenant X RATE` and `throttle TYPE --tenants`: one tenant's
rate across the fleet, set at run time in Postgres (stream_jobs/fairness/), and the limits
every tenant runs under now."""

from __future__ import annotations

import asyncio

from rich.console import Console
from rich.markup import escape

from stream_jobs.cli.tables import FittedTable, number_column, print_table, text_column
from stream_jobs.errors import ConfigError
from stream_jobs.fairness.limit_store import LimitStore
from stream_jobs.fairness.limits import OVERRIDE_REFRESH_S, TenantRate, rate_in_force
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.settings import Settings
from stream_jobs.tenants import NO_TENANT, FairnessSpec, checked_tenant

console = Console()


def fairness_of(policy: JobTypePolicy) -> FairnessSpec:
    """The type's `[fairness]` table; ConfigError when it has none (no gate would read a
    tenant's rate)."""
    if policy.fairness is None:
        raise ConfigError(
            f"{policy.job_type} has no [fairness] table in its TOML, so its workers limit no "
            "tenant; add one (e.g. tenant_rate = \"50/s\") and restart them first "
            "(docs/fairness.md).")
    return policy.fairness


def throttle_tenant(settings: Settings, policy: JobTypePolicy, tenant: str,
                    per_s: float | None, *, change: bool, reset: bool) -> None:
    """Set (`change`), reset or show `tenant`'s rate for every worker of the type."""
    spec = fairness_of(policy)
    checked_tenant(tenant)
    toml_per_s = spec.rate_of(tenant)
    who = f"{policy.job_type}, tenant {escape(tenant)!r}"

    async def run() -> tuple[TenantRate, TenantRate, int]:
        store = LimitStore(settings)
        try:
            before = await store.rate(policy.job_type, tenant, toml_per_s)
            if reset:
                await store.reset_override(policy.job_type, tenant)
            elif change:
                await store.set_override(policy.job_type, tenant, per_s)
            after = await store.rate(policy.job_type, tenant, toml_per_s)
            running = (await store.held(policy.job_type)).get(tenant, 0)
        finally:
            await store.close()
        return before, after, running

    before, after, running = asyncio.run(run())
    if not change and not reset:
        console.print(f"{who}: {after.spelt()}; {_concurrency(spec, tenant)}, {running} "
                      "running now")
        return
    console.print(f"{who}: {before.spelt()} -> {after.spelt()}")
    console.print(f"Workers apply it from their next start of its jobs; a tenant they did not "
                  f"limit, within {OVERRIDE_REFRESH_S:g} s.")


def show_tenants(settings: Settings, policy: JobTypePolicy, *, wide: bool) -> None:
    """Every tenant the TOML or an operator limits, or that holds slots: its limits now."""
    spec = fairness_of(policy)

    async def run() -> tuple[dict[str, float | None], dict[str, int]]:
        store = LimitStore(settings)
        try:
            return await store.overrides(policy.job_type), await store.held(policy.job_type)
        finally:
            await store.close()

    overrides, held = asyncio.run(run())
    named = sorted({name for name, _ in spec.tenants} | set(overrides) | set(held))
    table = FittedTable([text_column("tenant"), number_column("concurrency"),
                         number_column("running"), text_column("rate")], wide=wide,
                        title=f"{policy.job_type}: tenants' limits across the fleet")
    default_rate = rate_in_force(spec.tenant_rate_per_s, False, None)
    table.add_row("(any other)", _limit(spec.tenant_concurrency), "-", default_rate.spelt())
    for tenant in named:
        rate = rate_in_force(spec.rate_of(tenant), tenant in overrides, overrides.get(tenant))
        shown = "(no tenant)" if tenant == NO_TENANT else escape(tenant)
        table.add_row(shown, _limit(spec.concurrency_of(tenant)), str(held.get(tenant, 0)),
                      rate.spelt())
    print_table(console, table, wide=wide)


def _limit(concurrency: int | None) -> str:
    return "-" if concurrency is None else str(concurrency)


def _concurrency(spec: FairnessSpec, tenant: str) -> str:
    limit = spec.concurrency_of(tenant)
    return "no concurrency limit" if limit is None else f"at most {limit} running (toml)"


__all__ = ["fairness_of", "show_tenants", "throttle_tenant"]
