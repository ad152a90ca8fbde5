"""A job's attempts and the waits between them, from its lookup's sightings."""

from __future__ import annotations

from datetime import UTC, datetime

from stream_jobs.failures import FailureInfo
from stream_jobs.lookup import JobLocation, Sighting
from stream_jobs.lookup.attempts import steps_of


def failure(attempt: int) -> FailureInfo:
    return FailureInfo("handler-error", "ValueError", f"no {attempt}", "Traceback...",
                       1_000 * attempt + 500, worker_id=f"w{attempt}",
                       started_at_ms=1_000 * attempt, duration_ms=500)


def seen(role: str, attempt: int, at: int, *, failed: int | None = None,
         not_before: int | None = None, passed: bool = True) -> Sighting:
    name = {"lane": "default", "tier": "1m", "dlq": "dlq"}[role]
    return Sighting(f"t.{name}", role, name, 0, at, at, attempt,  # type: ignore[arg-type]
                    behind_commit=passed and role != "dlq", not_before_ms=not_before,
                    failure=None if failed is None else failure(failed))


def test_two_failures_then_a_success() -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    location = JobLocation("j", "done", "t", 3, when, sightings=(
        seen("lane", 1, 1), seen("tier", 2, 2, failed=1, not_before=60_000),
        seen("lane", 2, 3), seen("tier", 3, 4, failed=2, not_before=120_000),
        seen("lane", 3, 5)))
    steps = steps_of(location)
    assert [(s.kind, s.attempt, s.outcome) for s in steps] == [
        ("attempt", 1, "failed, retried"), ("wait", 2, ""), ("attempt", 2, "failed, retried"),
        ("wait", 3, ""), ("attempt", 3, "succeeded")]
    assert (steps[0].worker_id, steps[0].started_at_ms, steps[0].duration_ms) == ("w1", 1000,
                                                                                  500)
    assert steps[1].tier == "1m"
    assert steps[1].until_ms == 60_000
    assert steps[4].committed_at == when
    assert steps[4].worker_id is None  # not recorded for a success


def test_a_dead_letter_and_a_delayed_enqueue() -> None:
    dead = JobLocation("j", "dead_lettered", "t", 2, sightings=(
        seen("lane", 1, 1), seen("tier", 2, 2, failed=1), seen("lane", 2, 3),
        seen("dlq", 2, 4, failed=2)))
    assert [s.outcome for s in steps_of(dead) if s.kind == "attempt"] == [
        "failed, retried", "failed, dead-lettered"]
    delayed = JobLocation("j", "scheduled", "t", 1, sightings=(
        seen("tier", 1, 1, not_before=9_000, passed=False),))
    (wait,) = steps_of(delayed)
    assert (wait.kind, wait.attempt, wait.until_ms, wait.released) == ("wait", 1, 9_000, False)
    pending = JobLocation("j", "pending", "t", 1, sightings=(seen("lane", 1, 1, passed=False),))
    assert [s.outcome for s in steps_of(pending)] == ["waiting or running"]
