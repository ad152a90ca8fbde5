"""Per-tenant limits in Postgres: slots as leases, token buckets, operators' rates.

`acquire` is one statement, one round trip: it locks the tenant's bucket row, refills it
on Postgres' clock, takes the lowest free (or lapsed) slot below the limit with `FOR UPDATE
SKIP LOCKED`, and takes both the slot and a token or neither. Concurrent asks from any
number of processes queue on the bucket row (locked first, so one ask of a tenant at a
time looks for a slot, for the length of one statement); a slot row another statement has
locked is skipped, never waited for, and a slot taken meanwhile is seen taken (Postgres
rechecks a locked row's newest version), so no two holders ever share a slot and the
slots never outnumber the limit. `release` frees one slot, `renew` extends every slot
of a holder, `release_all` frees them: one statement each. The rules are `limits`'.

The rate in force is read inside `acquire` (an operator's override, else the TOML's rate
the caller passes), so `stream-jobs throttle T --tenant X RATE` holds from the next ask on.
"""

from __future__ import annotations

from typing import Any

from stream_jobs.errors import ConfigError
from stream_jobs.fairness.limits import TOKEN_EPSILON, Answer, TenantRate, rate_in_force
from stream_jobs.postgres.pool import DRIVER_ERRORS, MISSING_TABLE, LazyPool, database_error
from stream_jobs.ratelimit import BURST_S
from stream_jobs.settings import Settings

_SLOTS = "stream_jobs_tenant_slots"
_RATES = "stream_jobs_tenant_rates"

# The rows a tenant's asks lock and take: its bucket, and its slots up to the limit (a
# limit raised later adds slots; one lowered leaves the higher ones unused).
_PREPARE = (f"WITH bucket AS (INSERT INTO {_RATES} (job_type, tenant) VALUES ($1, $2) "
            "ON CONFLICT DO NOTHING) "
            f"INSERT INTO {_SLOTS} (job_type, tenant, slot) "
            "SELECT $1, $2, generate_series(0, $3::int - 1) ON CONFLICT DO NOTHING")

# $1 type, $2 tenant, $3 concurrency (NULL: none), $4 holder, $5 the TOML's rate (NULL:
# none), $6 lease seconds, $7 burst seconds, $8 token epsilon.
_ACQUIRE = f"""
WITH bucket AS (
    SELECT tokens, refilled_at, clock_timestamp() AS now,
           CASE WHEN overridden THEN override_per_s ELSE $5::float8 END AS rate
    FROM {_RATES} WHERE job_type = $1 AND tenant = $2 FOR UPDATE
), filled AS (
    SELECT now, rate, CASE WHEN rate IS NULL THEN tokens ELSE LEAST(
        GREATEST(1.0, rate * $7::float8),
        tokens + rate * GREATEST(0.0, EXTRACT(EPOCH FROM now - refilled_at)::float8)) END
        AS tokens
    FROM bucket
), free AS (
    SELECT slot FROM {_SLOTS}
    WHERE $3::int IS NOT NULL AND EXISTS (SELECT FROM filled)
      AND job_type = $1 AND tenant = $2 AND slot < $3::int
      AND (holder IS NULL OR expires_at < clock_timestamp())
    ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED
), verdict AS (
    SELECT ($3::int IS NULL OR EXISTS (SELECT FROM free)) AS slot_free,
           (SELECT rate IS NULL OR tokens >= 1.0 - $8::float8 FROM filled) AS token_there
), spent AS (
    UPDATE {_RATES} r SET refilled_at = f.now,
        tokens = f.tokens - CASE WHEN v.slot_free AND v.token_there THEN 1.0 ELSE 0.0 END
    FROM filled f, verdict v
    WHERE r.job_type = $1 AND r.tenant = $2 AND f.rate IS NOT NULL
), taken AS (
    UPDATE {_SLOTS} s SET holder = $4,
        expires_at = clock_timestamp() + make_interval(secs => $6::float8)
    FROM free, verdict v
    WHERE v.slot_free AND v.token_there
      AND s.job_type = $1 AND s.tenant = $2 AND s.slot = free.slot
    RETURNING s.slot
)
SELECT v.slot_free, v.token_there, (SELECT slot FROM taken) AS slot,
       (SELECT tokens FROM filled) AS tokens, (SELECT rate FROM filled) AS rate
FROM verdict v
"""

_RELEASE = (f"UPDATE {_SLOTS} SET holder = NULL, expires_at = NULL "
            "WHERE job_type = $1 AND tenant = $2 AND slot = $3 AND holder = $4")
_RELEASE_ALL = (f"UPDATE {_SLOTS} SET holder = NULL, expires_at = NULL "
                "WHERE holder = $2 AND job_type = $1")
_RENEW = (f"UPDATE {_SLOTS} SET expires_at = clock_timestamp() + make_interval(secs => $3) "
          "WHERE holder = $2 AND job_type = $1 RETURNING tenant, slot")
_OVERRIDES = (f"SELECT tenant, override_per_s FROM {_RATES} "
              "WHERE job_type = $1 AND overridden")
_SET_OVERRIDE = (f"INSERT INTO {_RATES} AS r (job_type, tenant, overridden, override_per_s, "
                 "override_at) VALUES ($1, $2, true, $3, clock_timestamp()) "
                 "ON CONFLICT (job_type, tenant) DO UPDATE SET overridden = true, "
                 "override_per_s = $3, override_at = clock_timestamp()")
_RESET_OVERRIDE = (f"UPDATE {_RATES} SET overridden = false, override_per_s = NULL, "
                   "override_at = clock_timestamp() WHERE job_type = $1 AND tenant = $2")
_HELD = (f"SELECT tenant, count(*) AS held FROM {_SLOTS} WHERE job_type = $1 "
         "AND holder IS NOT NULL AND expires_at >= clock_timestamp() GROUP BY tenant")


class LimitStore:
    """Slots, buckets and overrides of tenants through a small pool of their own, opened
    on first use."""

    def __init__(self, settings: Settings, *, pool: LazyPool | None = None) -> None:
        self.settings = settings
        self._pool = pool or LazyPool(settings, max_size=4, name="stream-jobs tenant limits")

    async def open(self) -> None:
        """Connect now (a worker learns at its start that Postgres does not answer)."""
        await self._pool.get()

    async def close(self) -> None:
        await self._pool.close()

    async def prepare(self, job_type: str, tenant: str, concurrency: int | None) -> None:
        """Make the rows `acquire` takes: the tenant's bucket and `concurrency` slots."""
        await self._run("execute", "prepare the tenant's limits", _PREPARE, job_type, tenant,
                        concurrency or 0)

    async def acquire(self, job_type: str, tenant: str, *, holder: str,
                      concurrency: int | None, toml_rate_per_s: float | None,
                      lease_s: float) -> Answer:
        """Take a slot (when `concurrency` is set) and a token (when a rate is in force),
        both or neither, in one statement; what was found. Call `prepare` first."""
        row = await self._run("fetchrow", "ask for a tenant's slot", _ACQUIRE, job_type,
                              tenant, concurrency, holder, toml_rate_per_s, lease_s, BURST_S,
                              TOKEN_EPSILON)
        if row is None or row["token_there"] is None:  # no bucket row: `prepare` not run
            return Answer(False, None, row is not None and bool(row["slot_free"]), None, None)
        slot = row["slot"]
        return Answer(granted=slot is not None or (concurrency is None and row["token_there"]),
                      slot=slot, slot_free=bool(row["slot_free"]), tokens=row["tokens"],
                      rate_per_s=row["rate"])

    async def release(self, job_type: str, tenant: str, slot: int, holder: str) -> None:
        """Free `slot` if `holder` still holds it (it may have lapsed and been taken)."""
        await self._run("execute", "free a tenant's slot", _RELEASE, job_type, tenant, slot,
                        holder)

    async def release_all(self, job_type: str, holder: str) -> int:
        """Free every slot `holder` holds of `job_type`; how many it held."""
        status = await self._run("execute", "free the tenants' slots", _RELEASE_ALL, job_type,
                                 holder)
        return int(str(status).rsplit(" ", 1)[-1])

    async def renew(self, job_type: str, holder: str, lease_s: float) -> set[tuple[str, int]]:
        """Extend the leases `holder` still holds by `lease_s`; those (tenant, slot)."""
        rows = await self._run("fetch", "renew the tenants' slots", _RENEW, job_type, holder,
                               lease_s)
        return {(row["tenant"], row["slot"]) for row in rows}

    async def overrides(self, job_type: str) -> dict[str, float | None]:
        """Operators' rates by tenant (None: the limit lifted)."""
        rows = await self._run("fetch", "read the tenants' rates", _OVERRIDES, job_type)
        return {row["tenant"]: row["override_per_s"] for row in rows}

    async def set_override(self, job_type: str, tenant: str, per_s: float | None) -> None:
        """Put `tenant` on `per_s` (None: no limit) whatever the TOML says, until reset."""
        await self._run("execute", "set the tenant's rate", _SET_OVERRIDE, job_type, tenant,
                        per_s)

    async def reset_override(self, job_type: str, tenant: str) -> None:
        """Put `tenant` back on the TOML's rate."""
        await self._run("execute", "reset the tenant's rate", _RESET_OVERRIDE, job_type,
                        tenant)

    async def rate(self, job_type: str, tenant: str, toml_per_s: float | None) -> TenantRate:
        """The rate `tenant` runs under now, and where it comes from."""
        overrides = await self.overrides(job_type)
        return rate_in_force(toml_per_s, tenant in overrides, overrides.get(tenant))

    async def held(self, job_type: str) -> dict[str, int]:
        """Slots held now (leases not lapsed), by tenant."""
        rows = await self._run("fetch", "count the tenants' slots", _HELD, job_type)
        return {row["tenant"]: row["held"] for row in rows}

    async def _run(self, method: str, what: str, statement: str, *args: object) -> Any:
        try:
            pool = await self._pool.get()
            return await getattr(pool, method)(statement, *args)
        except MISSING_TABLE as exc:
            raise ConfigError(
                f"Cannot {what}: schema {self.settings.database_schema!r} lacks the tables "
                "of per-tenant limits; run `stream-jobs db migrate` (or point "
                "STREAM_JOBS_DATABASE_SCHEMA at the schema that has them).") from exc
        except DRIVER_ERRORS as exc:
            raise database_error(exc, self._pool, what) from exc


__all__ = ["LimitStore"]
