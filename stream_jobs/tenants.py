"""Tenants: which customer a job is for, and a type's `[fairness]` table. Pure.

A job may name its tenant (`enqueue(..., tenant="acme")`); it travels in the `sj-tenant`
header and is read as `ctx.tenant`. A tenant is UTF-8 text of at most `MAX_TENANT_BYTES`
bytes with no control character: the client refuses anything else with one sentence, and
the decoder dead-letters a record from another producer that carries such a header
(`bad-header`) instead of running it.

A type opts in to fair dispatch with a `[fairness]` table in `topics/T.toml`
(docs/fairness.md):

    [fairness]
    weights = { acme = 3 }          # starts per round, by tenant (default 1 each)
    overflow = true                 # noisy tenants' jobs move to the lane P.T.overflow
    noisy_share = 0.1               # noisy: more than this share of the in-flight jobs
    noisy_min_jobs = 30             #   with at least this many of its own,
    noisy_time_share = 0.5          #   or more than this share of the processing time
    noisy_window = "10s"            #   over this window
    overflow_share = 0.25           # of concurrency for the overflow while lanes wait
    tenant_concurrency = 10         # running jobs per tenant, across the fleet
    tenant_rate = "50/s"            # starts per tenant, across the fleet

    [fairness.tenants.acme]         # one tenant's own limits
    concurrency = 50
    rate = "100/s"

`FairnessSpec` checks itself on construction, so code and TOML refuse the same mistakes.
What the runtime does with it is `stream_jobs.fairness`'.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from stream_jobs.durations import parse_duration, parse_rate
from stream_jobs.errors import ConfigError
from stream_jobs.job_ids import control_character

# The record header a job's tenant travels in (`stream_jobs.record.HEADER_TENANT`).
TENANT_HEADER = "sj-tenant"
# The one limit: the client's, the decoder's and the gateway's.
MAX_TENANT_BYTES = 128
# What jobs without a tenant count as, wherever tenants are compared or shown.
NO_TENANT = ""

FAIRNESS_KEYS = ("weights", "overflow", "noisy_share", "noisy_min_jobs", "noisy_time_share",
                 "noisy_window", "overflow_share", "tenant_concurrency", "tenant_rate",
                 "tenants")
TENANT_KEYS = ("concurrency", "rate")


def tenant_problem(value: object) -> str | None:
    """Why `value` cannot be a tenant (one sentence), or None."""
    if not isinstance(value, str):
        return f"A tenant is text, not {type(value).__name__}."
    if not value:
        return "A tenant cannot be empty; leave it out for a job of no tenant."
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        return "A tenant must be valid UTF-8 text (it holds a lone surrogate)."
    if size > MAX_TENANT_BYTES:
        return f"A tenant is at most {MAX_TENANT_BYTES} bytes of UTF-8; this one is {size}."
    char = control_character(value)
    if char is not None:
        return (f"A tenant cannot contain the control character U+{ord(char):04X}: tenants "
                "are shown in log lines, pages and terminals.")
    return None


def checked_tenant(value: str | None) -> str | None:
    """`value` (None: no tenant), or `ConfigError` with `tenant_problem`'s sentence."""
    if value is None:
        return None
    problem = tenant_problem(value)
    if problem is not None:
        raise ConfigError(problem)
    return value


def tenant_from_header(raw: bytes) -> str:
    """The tenant an `sj-tenant` header's bytes name; `ValueError` with a sentence when
    they are not one (too long, not UTF-8, a control character)."""
    if len(raw) > MAX_TENANT_BYTES:
        raise ValueError(f"is {len(raw)} bytes, over the limit of {MAX_TENANT_BYTES}")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    problem = tenant_problem(text)
    if problem is not None:
        raise ValueError(f"names no tenant: {problem}")
    return text


def tenant_in(headers: Sequence[tuple[str, bytes]]) -> str:
    """The `sj-tenant` of a record's headers (the last one, as the decoder reads it),
    decoded leniently and unchecked, or `NO_TENANT`: what fair dispatch reads per fetched
    record (the decoder judges the header when the job runs)."""
    for name, raw in reversed(headers):
        if name == TENANT_HEADER:
            return bytes(raw).decode(errors="replace")
    return NO_TENANT


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's own limits (`[fairness.tenants.NAME]`); None: the type's."""

    concurrency: int | None = None
    rate_per_s: float | None = None


@dataclass(frozen=True)
class FairnessSpec:
    """A type's `[fairness]` table (module docstring): validated on construction."""

    weights: tuple[tuple[str, int], ...] = ()
    overflow: bool = True
    noisy_share: float = 0.1
    noisy_min_jobs: int = 30
    noisy_time_share: float = 0.5
    noisy_window_s: float = 10.0
    overflow_share: float = 0.25
    tenant_concurrency: int | None = None
    tenant_rate_per_s: float | None = None
    tenants: tuple[tuple[str, TenantLimits], ...] = field(default=())

    def __post_init__(self) -> None:
        for name, weight in self.weights:
            _check_tenant_name(f"weights.{name}", name)
            _whole(f"weights.{name}", weight)
        for key in ("noisy_share", "noisy_time_share", "overflow_share"):
            share = getattr(self, key)
            if isinstance(share, bool) or not isinstance(share, int | float) \
                    or not 0 < share <= 1:
                raise _invalid(key, f"must be a share between 0 and 1 (such as 0.1), "
                                    f"not {share!r}")
        _whole("noisy_min_jobs", self.noisy_min_jobs)
        if not self.noisy_window_s > 0:
            raise _invalid("noisy_window", "must be longer than zero")
        if self.tenant_concurrency is not None:
            _whole("tenant_concurrency", self.tenant_concurrency)
        if self.tenant_rate_per_s is not None and not self.tenant_rate_per_s > 0:
            raise _invalid("tenant_rate", "must be a positive rate")
        for name, limits in self.tenants:
            _check_tenant_name(f"tenants.{name}", name)
            if limits.concurrency is not None:
                _whole(f"tenants.{name}.concurrency", limits.concurrency)

    @cached_property
    def _weight_by_tenant(self) -> dict[str, int]:
        return dict(self.weights)

    @cached_property
    def _limits_by_tenant(self) -> dict[str, TenantLimits]:
        return dict(self.tenants)

    def weight_of(self, tenant: str) -> int:
        """Starts per round of `tenant` (1 unless `weights` names it)."""
        return self._weight_by_tenant.get(tenant, 1)

    def concurrency_of(self, tenant: str) -> int | None:
        """Running jobs `tenant` may have across the fleet (None: no limit)."""
        own = self._limits_by_tenant.get(tenant)
        if own is not None and own.concurrency is not None:
            return own.concurrency
        return self.tenant_concurrency

    def rate_of(self, tenant: str) -> float | None:
        """Starts a second `tenant` may have across the fleet, by the TOML (None: none)."""
        own = self._limits_by_tenant.get(tenant)
        if own is not None and own.rate_per_s is not None:
            return own.rate_per_s
        return self.tenant_rate_per_s

    @property
    def limited(self) -> bool:
        """Whether any tenant has a fleet-wide concurrency or rate limit from the TOML."""
        return (self.tenant_concurrency is not None or self.tenant_rate_per_s is not None
                or any(limits != TenantLimits() for _, limits in self.tenants))

    @classmethod
    def from_toml(cls, raw: object) -> FairnessSpec:
        """The spec in a parsed `[fairness]` table; ConfigError naming the key."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"'fairness' must be a table ([fairness]), not {raw!r}.")
        values: dict[str, object] = {}
        for key, value in raw.items():
            values.update(_read_key(str(key), value))
        return cls(**values)  # type: ignore[arg-type]


def _read_key(key: str, raw: object) -> dict[str, object]:
    if key == "weights":
        if not isinstance(raw, Mapping):
            raise _invalid(key, f"must be a table such as {{acme = 3}}, not {raw!r}")
        return {"weights": tuple((str(name), _whole(f"weights.{name}", w))
                                 for name, w in raw.items())}
    if key == "overflow":
        if not isinstance(raw, bool):
            raise _invalid(key, f"must be true or false, not {raw!r}")
        return {"overflow": raw}
    if key in ("noisy_share", "noisy_time_share", "overflow_share"):
        return {key: raw}
    if key in ("noisy_min_jobs", "tenant_concurrency"):
        return {key: _whole(key, raw)}
    if key == "noisy_window":
        if not isinstance(raw, str | int | float) or isinstance(raw, bool):
            raise _invalid(key, f"must be a duration such as '10s', not {raw!r}")
        return {"noisy_window_s": _parsed(key, parse_duration, raw)}
    if key == "tenant_rate":
        return {"tenant_rate_per_s": _rate(key, raw)}
    if key == "tenants":
        if not isinstance(raw, Mapping):
            raise _invalid(key, f"must hold one table per tenant ([fairness.tenants.acme]), "
                                f"not {raw!r}")
        return {"tenants": tuple((str(name), _limits(str(name), table))
                                 for name, table in raw.items())}
    close = difflib.get_close_matches(key, FAIRNESS_KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown key 'fairness.{key}'{hint}; known keys are "
                      f"{', '.join(FAIRNESS_KEYS)}.")


def _limits(name: str, table: object) -> TenantLimits:
    where = f"tenants.{name}"
    if not isinstance(table, Mapping):
        raise _invalid(where, f"must be a table such as {{concurrency = 50}}, not {table!r}")
    for key in table:
        if key not in TENANT_KEYS:
            raise _invalid(f"{where}.{key}", f"is not known; a tenant's keys are "
                                             f"{', '.join(TENANT_KEYS)}")
    concurrency = table.get("concurrency")
    rate = table.get("rate")
    return TenantLimits(
        concurrency=None if concurrency is None else _whole(f"{where}.concurrency",
                                                            concurrency),
        rate_per_s=None if rate is None else _rate(f"{where}.rate", rate))


def _rate(key: str, raw: object) -> float:
    if not isinstance(raw, str):
        raise _invalid(key, f"must be a rate such as '50/s', not {raw!r}")
    return _parsed(key, parse_rate, raw)


def _parsed(key: str, parse: Callable[[str], float], raw: str | float) -> float:
    try:
        return parse(raw) if isinstance(raw, str) else parse(f"{raw}s")
    except ConfigError as exc:
        raise _invalid(key, str(exc)) from exc


def _whole(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid(key, f"must be a whole number of 1 or more, not {value!r}")
    return value


def _check_tenant_name(key: str, name: str) -> None:
    problem = tenant_problem(name)
    if problem is not None:
        raise _invalid(key, problem)


def _invalid(key: str, problem: str) -> ConfigError:
    return ConfigError(f"fairness.{key} {problem}")


__all__ = ["FAIRNESS_KEYS", "MAX_TENANT_BYTES", "NO_TENANT", "TENANT_HEADER", "FairnessSpec",
           "TenantLimits", "checked_tenant", "tenant_from_header", "tenant_in", "tenant_problem"]
