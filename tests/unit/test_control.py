"""Control records (`P._control`): what throttle writes and how workers fold it in."""

from __future__ import annotations

import pytest

from stream_jobs.cli.flow import _parse
from stream_jobs.errors import ConfigError
from stream_jobs.runtime.throttle import (
    RateInForce,
    RateOverride,
    apply_record,
    rate_in_force,
)


def test_an_override_round_trips_as_json() -> None:
    override = RateOverride(50.0, at_ms=1_700_000_000_000, by="drain")
    assert RateOverride.from_json(override.to_json()) == override
    lifted = RateOverride(None, at_ms=1, by="throttle")
    assert RateOverride.from_json(lifted.to_json()) == lifted


def test_garbage_is_not_an_override() -> None:
    for raw in (b"", b"[]", b"{}", b'{"rate_limit_per_s": "fast"}',
                b'{"rate_limit_per_s": 0}', b'{"rate_limit_per_s": -3}', b"\xff"):
        assert RateOverride.from_json(raw) is None


def test_records_fold_per_type_and_a_tombstone_resets() -> None:
    overrides: dict[str, RateOverride] = {}
    assert apply_record(overrides, b"email.send", RateOverride(50, 1).to_json()) == "email.send"
    assert apply_record(overrides, b"image.resize", RateOverride(5, 2).to_json()) == \
        "image.resize"
    assert apply_record(overrides, b"email.send", RateOverride(80, 3).to_json()) == "email.send"
    assert overrides["email.send"].rate_limit_per_s == 80
    assert apply_record(overrides, b"email.send", None) == "email.send"
    assert set(overrides) == {"image.resize"}
    assert apply_record(overrides, None, b"{}") is None
    assert apply_record(overrides, b"x", b"not json") is None
    assert set(overrides) == {"image.resize"}


def test_an_override_wins_over_the_toml_until_reset() -> None:
    assert rate_in_force(200, None) == RateInForce(200, "toml")
    assert rate_in_force(None, None) == RateInForce(None, "none")
    assert rate_in_force(200, RateOverride(50, 1)) == RateInForce(50, "throttle")
    assert rate_in_force(200, RateOverride(None, 1)) == RateInForce(None, "throttle")
    assert rate_in_force(None, RateOverride(10, 1, by="drain")) == RateInForce(10, "drain")


def test_throttle_reads_a_rate_or_a_word_for_no_limit() -> None:
    assert _parse("50/s") == 50
    assert _parse("600/m") == 10
    for word in ("none", "off", "unlimited", " None "):
        assert _parse(word) is None  # written as `rate_limit_per_s: null`, not a reset
    with pytest.raises(ConfigError, match="'none' to lift the limit"):
        _parse("fast")
