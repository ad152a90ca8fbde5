"""Job IDs and keys that could forge a log line or break a route are refused at enqueue,
by the client, the gateway's models and the CLI alike (stream_jobs/job_ids.py).

The decoder's half (a record of another producer) is in tests/unit/test_record.py and
tests/integration/test_hostile_input.py.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from stream_jobs.client import Job, JobClient
from stream_jobs.errors import ConfigError
from stream_jobs.gateway.api import JobIn
from stream_jobs.job_ids import MAX_JOB_ID_CHARS, control_character, id_problem, key_problem
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.settings import Settings
from stream_jobs.unique.rules import key_claim

CONTROL = [*map(chr, range(0x20)), "\x7f", *map(chr, range(0x80, 0xA0)), "\u2028", "\u2029"]


def _client() -> JobClient:
    return JobClient(Settings(), {"t": JobTypePolicy("t")})


@pytest.mark.parametrize("char", CONTROL)
def test_every_control_character_is_one(char: str) -> None:
    assert control_character(f"a{char}b") == char


@pytest.mark.parametrize("text", ["order-42", "commande:été", "ключ", "a b", "🙂", "tab-less"])
def test_printable_text_has_none(text: str) -> None:
    assert control_character(text) is None


@pytest.mark.parametrize(("given", "field", "says"), [
    ({"job_id": "abc\nCRITICAL forged"}, "job_id", "control character U+000A"),
    ({"job_id": "a\x85b"}, "job_id", "control character U+0085"),
    ({"job_id": "orders/42"}, "job_id", "cannot contain '/'"),
    ({"job_id": "x" * (MAX_JOB_ID_CHARS + 1)}, "job_id", "1 to 64 characters"),
    ({"key": "doc\r\n7"}, "key", "control character U+000D"),
    ({"key": "doc\u20287"}, "key", "control character U+2028"),
])
def test_the_client_refuses_in_one_sentence_naming_the_field(given: dict[str, str], field: str,
                                                             says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)) as refused:
        _client().prepare(Job("t", {}, **given))  # type: ignore[arg-type]
    message = str(refused.value)
    assert message.startswith(f"A {field} ")
    assert message.endswith(".")
    assert "\n" not in message.replace(given.get("job_id", ""), "")


def test_a_bytes_key_is_the_record_key_as_it_is() -> None:
    _, record = _client().prepare(Job("t", {}, key=b"\x00\n\xff"))
    assert record.key == b"\x00\n\xff"


def test_unique_and_debounce_keys_follow_the_same_rule() -> None:
    with pytest.raises(ConfigError, match="A unique_key cannot contain the control character"):
        key_claim(unique_key="k\n", unique_for="1m", debounce=None, key=None)
    with pytest.raises(ConfigError, match="A key cannot contain the control character"):
        key_claim(unique_key=None, unique_for=None, debounce="1s", key=b"k\x1b")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("job_id", "a/b", "cannot contain '/'"),
    ("job_id", "a\tb", "control character U+0009"),
    ("key", "a\x00b", "control character U+0000"),
])
def test_the_gateway_refuses_the_same_with_the_same_sentence(field: str, value: str,
                                                             says: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(says)) as refused:
        JobIn.model_validate({"payload": {}, field: value})
    assert refused.value.errors()[0]["loc"] == (field,)


_PRINTABLE = st.characters(blacklist_categories=("Cs",),
                           blacklist_characters="".join(CONTROL))


@given(st.text(_PRINTABLE, max_size=30), st.sampled_from(CONTROL),
       st.text(_PRINTABLE, max_size=30))
def test_any_id_or_key_with_a_control_character_is_refused(before: str, char: str,
                                                           after: str) -> None:
    text = before + char + after
    assert key_problem(text) is not None
    assert id_problem(text) is not None
    with pytest.raises(ConfigError):
        _client().prepare(Job("t", {}, key=text))
    with pytest.raises(ConfigError):
        _client().prepare(Job("t", {}, job_id=text))


@given(st.text(_PRINTABLE, min_size=1, max_size=MAX_JOB_ID_CHARS).filter(lambda t: "/" not in t))
def test_any_printable_id_within_the_length_without_a_slash_is_kept(job_id: str) -> None:
    assert id_problem(job_id) is None
    _, record = _client().prepare(Job("t", {}, job_id=job_id, key=job_id))
    assert record.job_id == job_id
    assert record.key == job_id.encode()
    assert JobIn.model_validate({"payload": {}, "job_id": job_id, "key": job_id}).job_id == job_id
