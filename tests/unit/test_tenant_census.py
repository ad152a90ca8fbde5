"""Tenants folded for operators: counts by tenant add up to the totals, and whatever the
number of tenants a report, a census and the metrics name at most TOP_TENANTS of them."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.fairness.census import WaitingCount, fold
from stream_jobs.fairness.tally import (
    MAX_TRACKED,
    TOP_TENANTS,
    TenantDwell,
    TenantFigures,
    TenantSection,
    section_of,
    top_split,
)
from stream_jobs.history.tally import DWELL_BUCKETS_S
from stream_jobs.lookup.attempts import steps_of
from stream_jobs.lookup.location import JobLocation, Sighting, judge

tenants = st.sampled_from(["", "acme", "globex", "initech", "umbrella", "hooli"]) | st.text(
    st.characters(min_codepoint=0x61, max_codepoint=0x7A), min_size=1, max_size=8)
counts = st.dictionaries(tenants, st.integers(min_value=0, max_value=1000), max_size=60)


def _headers(tenant: str) -> list[tuple[str, bytes]]:
    return [("sj-job-id", b"x")] + ([("sj-tenant", tenant.encode())] if tenant else [])


@given(counts, st.integers(min_value=1, max_value=15))
def test_the_top_and_the_rest_add_up_to_the_total(found: dict[str, int], top: int) -> None:
    figures = {name: TenantFigures(waiting=n) for name, n in found.items()}
    named, rest = top_split(figures, top)
    assert len(named) <= top
    assert sum(f.waiting for _, f in named) + rest.waiting == sum(found.values())
    if named and len(found) > top:  # the named ones are the biggest
        assert min(f.waiting for _, f in named) >= max(
            n for name, n in found.items() if name not in dict(named))


@given(counts, counts, st.lists(counts, max_size=4))
def test_a_census_counts_every_job_once_and_names_at_most_the_top(
        lanes: dict[str, int], overflow: dict[str, int], held: list[dict[str, int]]) -> None:
    sections = []
    for worker in held:
        dwell = TenantDwell()
        dwell.observe("acme", 0.2)
        records = [_headers(name) for name, n in worker.items() for _ in range(min(n, 3))]
        sections.append(section_of(dwell, records))
    census = fold("t", WaitingCount(lanes, overflow, 0, True), sections, workers=len(held))
    assert len(census.top) <= TOP_TENANTS
    total = census.total
    assert total.waiting == sum(lanes.values())
    assert total.overflow == sum(overflow.values())
    assert total.in_flight == sum(min(n, 3) for worker in held for n in worker.values())
    assert sum(total.dwells) == len(held)
    document = census.to_dict()
    assert len(document["tenants"]) <= TOP_TENANTS
    assert document["total"]["waiting"] == sum(lanes.values())


def test_a_report_names_at_most_the_top_tenants_and_sums_the_rest() -> None:
    dwell = TenantDwell()
    for i in range(50):
        dwell.observe(f"t{i:02}", 0.3)
    held = [_headers(f"t{i:02}") for i in range(50) for _ in range(i % 4)]
    section = section_of(dwell, held)
    assert len(section.top) == TOP_TENANTS
    assert sum(f.in_flight for _, f in section.top) + section.other.in_flight == len(held)
    assert sum(sum(f.dwells) for _, f in section.top) + sum(section.other.dwells) == 50
    # The wire form reads back the same; a garbled one is refused, an absent one is empty.
    assert TenantSection.from_obj(section.to_obj()) == section
    assert TenantSection.from_obj({}) == TenantSection()
    for bad in ([1], {"top": [["a", -1, None]]}, {"top": [["a", 1, [1, 2]]]}):
        try:
            TenantSection.from_obj(bad)
        except (ValueError, TypeError):
            continue
        raise AssertionError(f"{bad!r} was read as a section")
    # Taken: the next report counts from nothing.
    assert dwell.take() == ({}, [0] * (len(DWELL_BUCKETS_S) + 1))


def test_dwell_is_tracked_for_a_bounded_number_of_tenants() -> None:
    dwell = TenantDwell()
    for i in range(MAX_TRACKED + 5):
        dwell.observe(f"t{i}", 1.0)
    dwell.observe(None, 1.0)  # no tenant: a name like another, once room is left
    by_tenant, other = dwell.take()
    assert len(by_tenant) == MAX_TRACKED
    assert sum(other) == 6


def test_dwell_p95_is_read_off_the_buckets() -> None:
    dwell = TenantDwell()
    for _ in range(19):
        dwell.observe("acme", 0.004)
    dwell.observe("acme", 40.0)
    section = section_of(dwell, [])
    ((name, figures),) = section.top
    assert (name, figures.dwell_p95_s) == ("acme", 0.005)
    dwell.observe("acme", 40.0)
    ((_, figures),) = section_of(dwell, []).top
    assert figures.dwell_p95_s == 60.0


def _seen(role: str, *, behind: bool, at: int) -> Sighting:
    return Sighting(topic=f"jobs.t.{role}", role=role,  # type: ignore[arg-type]
                    name=role if role != "lane" else "default", partition=0, offset=0,
                    timestamp_ms=at, attempt=1, requeues=0, behind_commit=behind)


def test_a_job_moved_to_the_overflow_lane_is_pending_there() -> None:
    lane = _seen("lane", behind=True, at=1000)  # forwarded: its lane offset is committed
    moved = _seen("overflow", behind=False, at=1000)
    status, last = judge([moved, lane])
    assert (status, last) == ("pending", moved)
    (attempt,) = steps_of(JobLocation("j", "pending", "t", sightings=(lane, moved)))
    assert attempt.outcome == "waiting or running"


def test_counter_inputs_are_plain_mappings() -> None:
    census = fold("t", WaitingCount(Counter({"a": 2}), {}, 2, False), [], workers=0)
    assert census.to_dict()["scan"] == {"records": 2, "max_records": 100_000, "complete": False}
