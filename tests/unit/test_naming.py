from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.durations import format_duration, parse_duration, parse_rate
from stream_jobs.errors import ConfigError
from stream_jobs.naming import (
    TopicRef,
    dlq_group,
    dlq_topic,
    lane_topic,
    parse_topic,
    relay_group,
    tier_topic,
    validate_job_type,
    worker_group,
)

job_types = st.from_regex(r"\A[a-z][a-z0-9]{0,8}(\.[a-z][a-z0-9]{0,8}){0,2}\Z").filter(
    lambda t: t.rsplit(".", 1)[-1] not in ("high", "low", "dlq", "worker", "relay")
)


def test_names_match_the_contract() -> None:
    assert lane_topic("jobs", "email.send") == "jobs.email.send"
    assert lane_topic("jobs", "email.send", "high") == "jobs.email.send.high"
    assert lane_topic("jobs", "email.send", "low") == "jobs.email.send.low"
    assert tier_topic("jobs", "email.send", "5s") == "jobs.email.send.retry-5s"
    assert dlq_topic("jobs", "email.send") == "jobs.email.send.dlq"
    assert worker_group("jobs", "email.send") == "jobs.email.send.worker"
    assert relay_group("jobs", "email.send") == "jobs.email.send.relay"
    assert dlq_group("jobs", "email.send") == "jobs.email.send.dlq"


@given(job_types, st.sampled_from(["high", "default", "low"]))
def test_lane_names_round_trip(job_type: str, lane: str) -> None:
    assert parse_topic("jobs", lane_topic("jobs", job_type, lane)) == TopicRef(
        job_type, "lane", lane=lane
    )


@given(job_types, st.sampled_from(["5s", "1m", "10m", "1h"]))
def test_tier_and_dlq_names_round_trip(job_type: str, tier: str) -> None:
    assert parse_topic("p", tier_topic("p", job_type, tier)) == TopicRef(job_type, "tier",
                                                                           tier=tier)
    assert parse_topic("p", dlq_topic("p", job_type)) == TopicRef(job_type, "dlq")


@pytest.mark.parametrize("bad", ["", "Email", "email..send", ".email", "email send", "a.high",
                                 "a.retry-5s", "a.dlq"])
def test_bad_type_names_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        validate_job_type(bad)


def test_unknown_lane_and_foreign_topic_are_refused() -> None:
    with pytest.raises(ConfigError, match="priority lane"):
        lane_topic("jobs", "a", "urgent")
    with pytest.raises(ConfigError, match="prefix"):
        parse_topic("jobs", "other.a")


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5), ("1m", 60), ("10m", 600), ("7d", 604800),
                                               ("250ms", 0.25), ("1.5h", 5400), (3, 3)])
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@given(st.integers(min_value=1, max_value=10**7))
def test_format_duration_round_trips(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("bad", ["5", "five s", "-5s", "5y", ""])
def test_bad_durations_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(bad)


def test_rates() -> None:
    assert parse_rate("200/s") == 200
    assert parse_rate("60/m") == 1
    with pytest.raises(ConfigError):
        parse_rate("0/s")
    with pytest.raises(ConfigError):
        parse_rate("fast")
