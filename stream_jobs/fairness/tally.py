"""Tenants' figures, bounded: the top few by name, the rest as one `other`. Pure.

A worker counts, per tenant, how long the jobs it started had waited (`TenantDwell`,
dwell buckets of `stream_jobs.history.tally`, from its report to the next one), and at
each report what it holds fetched and unfinished (`in flight`). Its report carries the
`TOP_TENANTS` tenants with the most in flight (then the most dwells) and the rest summed
(`TenantSection`). Readers add sections of several workers and census counts up
(`TenantFigures.plus`); dwell percentiles are read off the summed buckets, exact to the
bucket as in the history. Whatever the number of tenants, a report, a table and the
metrics hold at most `TOP_TENANTS` names and `other`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_jobs.history.tally import DWELL_BUCKETS_S, quantile
from stream_jobs.record import tenant_in

# Tenants shown by name in a report, a table and the metrics; the rest are `other`.
TOP_TENANTS = 10
# Tenants a worker tracks the dwell of between two reports; later ones count as `other`.
MAX_TRACKED = 1000
# How `other` is named in the metrics' `tenant` label and in JSON.
OTHER = "other"


def _buckets() -> list[int]:
    return [0] * (len(DWELL_BUCKETS_S) + 1)  # the last one is +Inf


@dataclass
class TenantFigures:
    """One tenant's (or `other`'s) figures: jobs waiting in the lanes, in the overflow
    lane, fetched by a worker and unfinished, and dwell times as bucket counts."""

    waiting: int = 0
    overflow: int = 0
    in_flight: int = 0
    dwells: list[int] = field(default_factory=_buckets)

    def plus(self, other: TenantFigures) -> TenantFigures:
        return TenantFigures(self.waiting + other.waiting, self.overflow + other.overflow,
                             self.in_flight + other.in_flight,
                             [a + b for a, b in zip(self.dwells, other.dwells, strict=True)])

    @property
    def jobs(self) -> int:
        """Jobs not finished: waiting, in the overflow lane, or in flight."""
        return self.waiting + self.overflow + self.in_flight

    @property
    def dwell_p95_s(self) -> float | None:
        """The 95th percentile dwell (a bucket's upper bound), or None without starts."""
        return quantile(self.dwells, DWELL_BUCKETS_S, 0.95)

    def to_dict(self) -> dict[str, Any]:
        return {"waiting": self.waiting, "overflow": self.overflow,
                "in_flight": self.in_flight, "dwell_p95_s": self.dwell_p95_s,
                "dwells": sum(self.dwells)}


def _rank(item: tuple[str, TenantFigures]) -> tuple[int, int, str]:
    name, figures = item
    return (-figures.jobs, -sum(figures.dwells), name)


def top_split(figures: Mapping[str, TenantFigures], top: int = TOP_TENANTS
              ) -> tuple[list[tuple[str, TenantFigures]], TenantFigures]:
    """The `top` tenants with the most unfinished jobs (then the most dwells, then by
    name), most first, and the rest summed."""
    ranked = sorted(figures.items(), key=_rank)
    rest = TenantFigures()
    for _, found in ranked[top:]:
        rest = rest.plus(found)
    return ranked[:top], rest


@dataclass(frozen=True)
class TenantSection:
    """A worker report's tenants: the top ones by name, and the rest summed."""

    top: tuple[tuple[str, TenantFigures], ...] = ()
    other: TenantFigures = field(default_factory=TenantFigures)

    def only(self, *, in_flight: bool) -> TenantSection:
        """The section with its in-flight counts only (a worker's latest report says what
        it holds now), or its dwells only (every report of a window adds its own)."""
        def kept(figures: TenantFigures) -> TenantFigures:
            return (TenantFigures(in_flight=figures.in_flight) if in_flight
                    else TenantFigures(dwells=list(figures.dwells)))

        return TenantSection(tuple((name, kept(f)) for name, f in self.top), kept(self.other))

    def to_obj(self) -> dict[str, Any]:
        return {"top": [[name, f.in_flight, f.dwells] for name, f in self.top],
                "other": [self.other.in_flight, self.other.dwells]}

    @classmethod
    def from_obj(cls, raw: object) -> TenantSection:
        """The section in `raw` (empty for none: a report of an older worker); ValueError
        for anything else."""
        if not raw:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError("a tenants section is an object")
        top = tuple((str(name), _figures(in_flight, dwells))
                    for name, in_flight, dwells in raw.get("top", ()))
        in_flight, dwells = raw.get("other", (0, None))
        return cls(top, _figures(in_flight, dwells))


def _figures(in_flight: object, dwells: object) -> TenantFigures:
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 0:
        raise ValueError("in flight is a count")
    if dwells is None:
        return TenantFigures(in_flight=in_flight)
    if not isinstance(dwells, list) or len(dwells) != len(DWELL_BUCKETS_S) + 1 or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in dwells):
        raise ValueError("dwells are one count per bucket")
    return TenantFigures(in_flight=in_flight, dwells=list(dwells))


class TenantDwell:
    """Dwell times by tenant since the last `take` (at most `MAX_TRACKED` tenants; the
    dwells of any further ones count as `other`'s)."""

    __slots__ = ("_by_tenant", "_other")

    def __init__(self) -> None:
        self._by_tenant: dict[str, list[int]] = {}
        self._other = _buckets()

    def observe(self, tenant: str | None, dwell_s: float) -> None:
        """One started job's dwell (`tenant` None: a job of no tenant)."""
        counts = self._by_tenant.get(tenant or "")
        if counts is None:
            counts = self._other if len(self._by_tenant) >= MAX_TRACKED \
                else self._by_tenant.setdefault(tenant or "", _buckets())
        counts[bisect_left(DWELL_BUCKETS_S, max(dwell_s, 0.0))] += 1

    def take(self) -> tuple[dict[str, list[int]], list[int]]:
        """(dwell buckets by tenant, `other`'s) since the last take; counting starts over."""
        taken = self._by_tenant, self._other
        self._by_tenant, self._other = {}, _buckets()
        return taken


def section_of(dwell: TenantDwell, held: Iterable[Sequence[tuple[str, bytes]]], *,
               top: int = TOP_TENANTS) -> TenantSection:
    """A report's tenants: the headers of the records a worker `held` (fetched, not
    finished) counted by `sj-tenant`, and the dwells since the last report (taken)."""
    dwells, other_dwells = dwell.take()
    figures: dict[str, TenantFigures] = {name: TenantFigures(dwells=counts)
                                         for name, counts in dwells.items()}
    for headers in held:
        name = tenant_in(headers)
        found = figures.get(name)
        if found is None:
            found = figures[name] = TenantFigures()
        found.in_flight += 1
    named, rest = top_split(figures, top)
    rest.dwells = [a + b for a, b in zip(rest.dwells, other_dwells, strict=True)]
    return TenantSection(tuple(named), rest)


__all__ = ["MAX_TRACKED", "OTHER", "TOP_TENANTS", "TenantDwell", "TenantFigures",
           "TenantSection", "section_of", "top_split"]
