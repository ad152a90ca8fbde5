"""What unique and debounced enqueues accept, and what they answer (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.errors import ConfigError
from stream_jobs.unique.rules import MAX_KEY_CHARS, Enqueued, KeyClaim, key_claim


def claim(**given: Any) -> KeyClaim | None:
    options: dict[str, Any] = {"unique_key": None, "unique_for": None, "debounce": None,
                               "key": None}
    options.update(given)
    return key_claim(**options)


def test_a_plain_enqueue_claims_nothing() -> None:
    assert claim() is None
    assert claim(key="user-42") is None


@pytest.mark.parametrize(("window", "seconds"), [("10m", 600.0), (90, 90.0), (2.5, 2.5),
                                                 (timedelta(hours=1), 3600.0)])
def test_unique_for_is_a_duration(window: object, seconds: float) -> None:
    assert claim(unique_key="k", unique_for=window) == KeyClaim("unique", "k", seconds)


def test_a_unique_key_alone_is_held_while_its_job_is_pending() -> None:
    assert claim(unique_key="digest:user-42") == KeyClaim("unique", "digest:user-42", None)


def test_debounce_is_on_the_unique_key_else_the_partition_key() -> None:
    assert claim(key="doc-1", debounce="30s") == KeyClaim("debounce", "doc-1", 30.0)
    assert claim(key=b"doc-1", debounce=30) == KeyClaim("debounce", "doc-1", 30.0)
    assert claim(key="doc-1", unique_key="index:doc-1", debounce="30s") == \
        KeyClaim("debounce", "index:doc-1", 30.0)


@pytest.mark.parametrize(("given", "says"), [
    ({"unique_for": "10m"}, "unique_for needs a unique_key"),
    ({"debounce": "30s"}, "debounce needs a key"),
    ({"unique_key": "k", "unique_for": "1m", "debounce": "30s"}, "not both"),
    ({"key": "k", "debounce": "30s", "delay": 5}, "without delay or run_at"),
    ({"key": "k", "debounce": "30s", "run_at": datetime(2030, 1, 1, tzinfo=UTC)},
     "without delay or run_at"),
    ({"key": "k", "debounce": "0s"}, "more than 0 s"),
    ({"key": "k", "debounce": "2d"}, "at most a day"),
    ({"unique_key": "k", "unique_for": "soon"}, "not a duration"),
    ({"unique_key": "k", "unique_for": -1}, "negative"),
    ({"unique_key": "k", "unique_for": True}, "duration such as"),
    ({"unique_key": ""}, "non-empty string"),
    ({"unique_key": "x" * (MAX_KEY_CHARS + 1)}, "over the limit"),
    ({"unique_key": "a\x00b"}, "unique_key cannot contain the control character U\\+0000"),
    ({"key": "line\nforged", "debounce": "1s"}, "key cannot contain the control character"),
    ({"key": b"\xff", "debounce": "1s"}, "UTF-8"),
])
def test_what_cannot_mean_anything_is_refused_in_one_sentence(given: dict[str, Any],
                                                              says: str) -> None:
    with pytest.raises(ConfigError, match=says) as refused:
        claim(**given)
    assert str(refused.value).endswith(".")


@given(st.text(max_size=300), st.one_of(st.none(), st.text(max_size=8), st.integers(),
                                        st.floats(allow_nan=False)))
def test_any_unique_key_and_window_is_a_claim_or_a_config_error(key: str,
                                                                window: object) -> None:
    try:
        made = claim(unique_key=key, unique_for=window)
    except ConfigError:
        return
    assert made is not None
    assert made.key == key


def test_an_enqueued_answer_is_its_job_id() -> None:
    held = Enqueued("01a2-holder", sent=False)
    assert held == "01a2-holder"
    assert isinstance(held, str)
    assert orjson.dumps({"id": held}) == b'{"id":"01a2-holder"}'
    assert {held: 1}["01a2-holder"] == 1
    assert not held.sent
    assert held.superseded is None
    later = Enqueued("01a2-b", sent=True, superseded="01a2-a", not_before_ms=5)
    assert repr(later) == "Enqueued('01a2-b', sent=True, superseded='01a2-a')"
