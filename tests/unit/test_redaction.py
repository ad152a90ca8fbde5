"""Every form a URL carries a password in, and every secret the settings hold, masked in
what a person sees (stream_jobs/redaction.py). The gateway's page is tested for real in
tests/integration/test_gateway_secrets.py."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import SecretStr

from stream_jobs.redaction import (
    FIELD_MASK,
    MASK,
    mask_fields,
    redact_text,
    redact_url,
    secrets_of,
    shown_payload,
)
from stream_jobs.settings import Settings

CANARY = "hunter2-canary"
HOST = "127.0.0.1:54320/stream_jobs"


@pytest.mark.parametrize(("url", "shown"), [
    (f"postgresql://alice:{CANARY}@{HOST}", f"postgresql://alice:***@{HOST}"),
    (f"postgresql://alice@{HOST}?password={CANARY}", f"postgresql://alice@{HOST}?password=***"),
    (f"postgresql://alice@{HOST}?sslmode=require&sslpassword={CANARY}&x=1",
     f"postgresql://alice@{HOST}?sslmode=require&sslpassword=***&x=1"),
    (f"postgresql://alice@{HOST}?PassWord={CANARY}", f"postgresql://alice@{HOST}?PassWord=***"),
    (f"postgresql://alice@{HOST}?SSLPASSWORD={CANARY}",
     f"postgresql://alice@{HOST}?SSLPASSWORD=***"),
    # asyncpg decodes the names of query parameters: this one is its password too.
    (f"postgresql://alice@{HOST}?pass%77ord={CANARY}", f"postgresql://alice@{HOST}?pass%77ord=***"),
    (f"postgresql://alice:{CANARY}@{HOST}?password={CANARY}",
     f"postgresql://alice:***@{HOST}?password=***"),
    # An '@' left unencoded in the password: urllib ends the userinfo at the last '@'.
    (f"postgresql://alice:p@ss{CANARY}@{HOST}", f"postgresql://alice:***@{HOST}"),
    (f"postgresql://alice@{HOST}", f"postgresql://alice@{HOST}"),
    (f"postgresql://{HOST}?sslmode=require", f"postgresql://{HOST}?sslmode=require"),
])
def test_every_password_a_url_carries_is_masked(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_percent_encoded_password_is_masked_as_written_and_as_decoded() -> None:
    password = "p@ss w/rd:1%"
    url = f"postgresql://alice:{quote(password, safe='')}@{HOST}"
    assert redact_url(url) == f"postgresql://alice:***@{HOST}"
    settings = Settings(database_url=url)
    assert password in secrets_of(settings, {})
    # A driver that quotes the decoded password in its message.
    said = f"could not log in as alice with password {password}"
    assert password not in redact_text(said, settings, {})


def test_a_url_inside_a_longer_message_is_masked() -> None:
    message = (f"Postgres did not answer at postgresql://alice@{HOST}?password={CANARY} "
               f"(STREAM_JOBS_DATABASE_URL): [Errno 111] Connect call failed; also tried "
               f"'postgres://bob:{CANARY}@other/db'.")
    shown = redact_text(message)
    assert CANARY not in shown
    assert shown == (f"Postgres did not answer at postgresql://alice@{HOST}?password=*** "
                     "(STREAM_JOBS_DATABASE_URL): [Errno 111] Connect call failed; also tried "
                     "'postgres://bob:***@other/db'.")


def test_a_keyword_connection_string_in_a_message_is_masked() -> None:
    shown = redact_text(f"host=db password='{CANARY} x' sslpassword={CANARY} port=5")
    assert shown == "host=db password=*** sslpassword=*** port=5"


def test_the_settings_secrets_are_masked_wherever_they_appear() -> None:
    settings = Settings(database_url=f"postgresql://alice@{HOST}?password=db-secret",
                        gateway_token=SecretStr("token-secret"),
                        kafka_sasl_password=SecretStr("sasl-secret"),
                        kafka_ssl_key_password=SecretStr("key-secret"))
    text = "db-secret, token-secret; sasl-secret/key-secret"
    assert redact_text(text, settings, {}) == "***, ***; ***/***"


def test_the_pgpassword_environment_variable_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", CANARY)
    assert redact_text(f"password authentication failed ({CANARY})") == \
        "password authentication failed (***)"
    assert redact_text(CANARY, None, {}) == CANARY  # an environment given is the one read


def test_a_url_that_urllib_cannot_read_is_still_masked() -> None:
    assert redact_url(f"postgresql://alice:{CANARY}@[::1/db") == "postgresql://alice:***@[::1/db"


_SECRET = st.text(st.characters(blacklist_characters="*", blacklist_categories=("Cs",)),
                  min_size=1, max_size=20)


@given(secret=_SECRET, before=st.text(max_size=30), after=st.text(max_size=30))
def test_a_settings_secret_never_survives(secret: str, before: str, after: str) -> None:
    settings = Settings(gateway_token=SecretStr(secret))
    assert secret not in redact_text(before + secret + after, settings, {})


_PASSWORD = st.text(st.characters(blacklist_characters="*", blacklist_categories=("Cs",)),
                    min_size=1, max_size=20)


@given(password=_PASSWORD, before=st.text(max_size=30), after=st.text(max_size=30),
       name=st.sampled_from(["password", "sslpassword", "PASSWORD", "SslPassword"]),
       userinfo=st.booleans())
def test_a_database_password_never_survives(password: str, before: str, after: str, name: str,
                                            userinfo: bool) -> None:
    encoded = quote(password, safe="")
    url = (f"postgresql://alice:{encoded}@{HOST}" if userinfo
           else f"postgresql://alice@{HOST}?{name}={encoded}")
    settings = Settings(database_url=url)
    for text in (url, f"{before} {url} {after}", f"{before}{password}{after}"):
        shown = redact_text(text, settings, {})
        assert password not in shown
        assert encoded not in shown


@given(password=st.from_regex(r"[A-Za-z0-9._~-]{4,20}", fullmatch=True),
       name=st.sampled_from(["password", "sslpassword", "Password"]), text=st.text(max_size=40))
def test_a_url_in_any_text_loses_its_password_without_settings(password: str, name: str,
                                                                 text: str) -> None:
    assume(password not in f"postgresql://alice@{HOST}?{name}=")
    for url in (f"postgresql://alice:{password}@{HOST}",
                f"postgresql://alice@{HOST}?{name}={password}"):
        shown = redact_text(f"{text} {url} {text}")
        assert f"{MASK}@" in shown or f"={MASK}" in shown
        assert password not in shown.replace(text, "")


# -- payload fields (a type's `redact`) ---------------------------------------------------


def test_named_fields_are_masked_at_the_depth_their_path_names() -> None:
    payload = {"card_number": "4111", "amount": 5,
               "customer": {"ssn": "123", "name": "Ada", "card_number": "kept"},
               "lines": [{"customer": {"ssn": "9"}}]}
    shown = mask_fields(payload, ["card_number", "customer.ssn"])
    assert shown == {"card_number": FIELD_MASK, "amount": 5,
                     "customer": {"ssn": FIELD_MASK, "name": "Ada", "card_number": "kept"},
                     "lines": [{"customer": {"ssn": "9"}}]}
    assert payload["card_number"] == "4111"  # the given payload is not changed


def test_lists_of_objects_are_entered_and_other_payloads_shown_as_they_are() -> None:
    assert mask_fields([{"ssn": 1}, 2], ["ssn"]) == [{"ssn": FIELD_MASK}, 2]
    assert mask_fields({"items": [{"pin": 1}, {"x": 2}]}, ["items.pin"]) == {
        "items": [{"pin": FIELD_MASK}, {"x": 2}]}
    for payload in ("text", 7, None, True, 1.5):
        assert mask_fields(payload, ["a"]) == payload
    assert mask_fields({"a": {"b": 1}}, ["a.b", "a"]) == {"a": FIELD_MASK}
    assert mask_fields({"a": {"b": 1}}, ["a", "a.b"]) == {"a": FIELD_MASK}


names = st.sampled_from(["a", "b", "ssn", "card"])
trees = st.recursive(st.integers() | st.text(max_size=3) | st.none(),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(names, inner, max_size=4), max_leaves=12)
paths = st.lists(st.lists(names, min_size=1, max_size=3).map(".".join), max_size=3)


def _reached(value: object, parts: list[str]) -> list[object]:
    """Every value found at `parts` below `value` (through lists, as masking goes)."""
    if isinstance(value, list):
        return [found for item in value for found in _reached(item, parts)]
    if not parts:
        return [value]
    if isinstance(value, dict) and parts[0] in value:
        return _reached(value[parts[0]], parts[1:])
    return []


def _untouched(before: object, after: object, named: set[tuple[str, ...]],
               at: tuple[str, ...] = ()) -> None:
    """Everything at a path no name covers is as it was."""
    if any(at[:len(path)] == path for path in named):
        return
    if isinstance(before, list):
        assert isinstance(after, list)
        assert len(after) == len(before)
        for b, a in zip(before, after, strict=True):
            _untouched(b, a, named, at)
    elif isinstance(before, dict):
        assert isinstance(after, dict)
        assert after.keys() == before.keys()
        for key in before:
            _untouched(before[key], after[key], named, (*at, key))
    else:
        assert after == before


@given(trees, paths)
def test_nothing_named_survives_and_nothing_else_changes(payload: object,
                                                         named: list[str]) -> None:
    shown = mask_fields(payload, named)
    for path in named:
        assert all(found == FIELD_MASK for found in _reached(shown, path.split(".")))
    _untouched(payload, shown, {tuple(path.split(".")) for path in named})


def test_a_payload_is_shown_indented_with_its_named_fields_masked() -> None:
    shown = shown_payload(b'{"card_number": "4111", "n": 1}', ["card_number"])
    assert shown is not None
    assert "4111" not in shown
    assert FIELD_MASK in shown
    assert '"n": 1' in shown
    assert shown_payload(None, ["a"]) is None
    assert shown_payload(b"not json", []) == "not json"
    assert "not json" not in (shown_payload(b"not json", ["a"]) or "")
