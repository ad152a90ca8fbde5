"""Hostile input on the surfaces that came after the decoder (issue 28): the outbox's rows,
unique and debounce keys, the batch and chain header, results over the limit, cancels,
tenants and job IDs. Each pure decoder or check is fed garbage and must either accept it
(and then the value round-trips) or refuse it with our own error and a sentence, never a
bare KeyError, UnicodeError, IndexError or RecursionError. Schedules are in
test_hostile_schedules.py. Every property runs a fixed number of examples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_jobs.app import App
from stream_jobs.cancels.rules import (
    MAX_REASON_CHARS,
    NoticeKind,
    checked_reason,
    notice,
    parse_notice,
    released_key,
    released_text,
)
from stream_jobs.errors import (
    BadRecord,
    ConfigError,
    ResultError,
    ResultTooLarge,
    UnknownWorkflow,
)
from stream_jobs.job_ids import control_character
from stream_jobs.jobs import Job
from stream_jobs.outbox.relay import _row
from stream_jobs.outbox.rows import HEADER_UNREADABLE, decode_headers, encode_headers
from stream_jobs.record import (
    HEADER_DEBOUNCE,
    HEADER_JOB_ID,
    HEADER_TENANT,
    HEADER_TYPE,
    HEADER_UNIQUE,
    HEADER_WORKFLOW,
    MAX_ROW_TEXT_CHARS,
    JobRecord,
    decode_record,
)
from stream_jobs.results.rules import encode_result
from stream_jobs.settings import Settings
from stream_jobs.tenants import MAX_TENANT_BYTES, checked_tenant, tenant_from_header
from stream_jobs.tools.cancel import cancel_job
from stream_jobs.unique.rules import MAX_DEBOUNCE_S, MAX_KEY_CHARS, MAX_UNIQUE_FOR_S, key_claim
from stream_jobs.workflows.members import Membership, check_workflow_id, parse_membership
from stream_jobs.workflows.progress import read_progress

from .test_record import json_values

T = TypeVar("T")
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Text as hostile as Python strings get: lone surrogates, NUL and other controls, long runs.
nasty_chars = st.sampled_from(["\x00", "\n", "\x1b", "\x7f", "\u2028", "\ud800", "\udfff",
                               "/", ":", "\t", "é", "\U0001f600"])
nasty_text = st.one_of(
    st.text(max_size=24),
    st.lists(nasty_chars | st.text(max_size=3), max_size=12).map("".join),
    st.builds(lambda ch, n: ch * n, st.sampled_from(["a", "é", "\x00", "\ud800"]),
              st.sampled_from([63, 64, 65, 128, 129, 255, 256, 10_000, 1_000_000])),
)
nasty_bytes = st.one_of(
    st.binary(max_size=32),
    st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"a\nb", b"batch:\x00"]),
    st.builds(lambda b, n: b * n, st.sampled_from([b"a", b"\xff", b"\x00"]),
              st.sampled_from([128, 129, 255, 256, 65_536])),
    nasty_text.map(lambda t: t.encode(errors="surrogatepass")),
)


def attempt(call: Callable[[], T], *errors: type[Exception]) -> tuple[T | None, Any]:
    """`call()`'s value, or the error of `errors` it raised (anything else fails the test)."""
    try:
        return call(), None
    except errors as exc:
        return None, exc


def a_sentence(error: Exception) -> None:
    text = str(error)
    assert text.endswith("."), text
    assert 10 < len(text) < 600, text  # names what was wrong, never quotes a megabyte


# -- the outbox row's headers column --------------------------------------------------------


pairs = st.lists(st.tuples(nasty_text, nasty_text), max_size=6)
stored = st.one_of(
    json_values, pairs, st.lists(json_values, max_size=4),
    st.lists(st.lists(json_values, max_size=3), max_size=4),
    st.builds(lambda n: [["sj-job-id", "x"]] * n, st.sampled_from([0, 1, 10_000])),
)


@FUZZ
@given(value=stored, as_text=st.booleans())
def test_fuzz_the_outbox_headers_column(value: Any, as_text: bool) -> None:
    """Whatever another program put in the column: pairs of text, or one sentence."""
    try:
        raw: Any = orjson.dumps(value).decode() if as_text else value
    except TypeError:
        raw = value  # a lone surrogate: only the parsed form can hold it
    headers, bad = attempt(lambda: decode_headers(raw), BadRecord)
    if headers is None:
        assert bad.reason == "bad-header"
        a_sentence(bad)
        return
    assert all(isinstance(n, str) and isinstance(v, bytes) for n, v in headers)
    assert decode_headers(encode_headers(headers)) == headers  # and it round-trips


@FUZZ
@given(st.lists(st.tuples(st.text(max_size=12), st.text(max_size=24)), max_size=8))
def test_headers_the_client_writes_come_back_as_they_were(written: list[tuple[str, str]]
                                                          ) -> None:
    try:
        headers = [(name, value.encode()) for name, value in written]
    except UnicodeEncodeError:
        return  # no record of ours holds a lone surrogate (the client refuses it first)
    assert decode_headers(encode_headers(headers)) == tuple(headers)


@pytest.mark.parametrize("column", [
    "{}", '"x"', "[1]", '[["sj-job-id"]]', '[["sj-job-id", null]]', '[[1, "x"]]',
    "[" * 2000 + "]" * 2000, b"\xff", '[["a", {"b": 1}]]',
])
def test_a_row_with_unreadable_headers_is_sent_with_the_cause_not_stuck(column: Any) -> None:
    # It used to raise from the claim (TypeError, ValueError): every round failed on it,
    # and no row of the table moved again.
    row = _row({"id": 7, "topic": "t.a.b", "key": None, "value": b"{}", "headers": column,
                "attempts": 0})
    [(name, cause)] = row.headers()
    assert name == HEADER_UNREADABLE
    assert cause.decode().startswith("The outbox row's header"), cause
    assert (row.id, row.topic, row.payload) == (7, "t.a.b", b"{}")


# -- unique keys and debounce -----------------------------------------------------------------

windows = st.one_of(
    st.none(), st.floats(), st.integers(-10, 10**30), st.sampled_from([10**400, 0, -1]),
    st.timedeltas(max_value=timedelta(days=999_999)), nasty_text,
    st.sampled_from(["10m", "1d", "99999999999999999999999d", "nan", "1e400s", "", "-5s"]),
    st.lists(st.integers(), max_size=2), st.booleans(),
)


@FUZZ
@given(unique_key=st.none() | nasty_text, unique_for=windows, debounce=windows,
       key=st.none() | nasty_text | nasty_bytes)
def test_fuzz_unique_and_debounce_arguments(unique_key: Any, unique_for: Any, debounce: Any,
                                            key: Any) -> None:
    claim, refused = attempt(lambda: key_claim(unique_key=unique_key, unique_for=unique_for,
                                               debounce=debounce, key=key), ConfigError)
    if refused is not None:
        a_sentence(refused)
        return
    if claim is None:
        assert (unique_key, unique_for, debounce) == (None, None, None)
        return
    # What is taken can be a header and a row: text, bounded, printable, finite.
    assert 0 < len(claim.key) <= MAX_KEY_CHARS
    claim.key.encode()
    assert control_character(claim.key) is None
    if claim.window_s is not None:
        assert math.isfinite(claim.window_s)
        limit = MAX_DEBOUNCE_S if claim.kind == "debounce" else MAX_UNIQUE_FOR_S
        assert 0 <= claim.window_s <= limit


@pytest.mark.parametrize(("arguments", "said"), [
    ({"unique_key": "k", "unique_for": math.inf}, "not a finite duration"),
    ({"unique_key": "k", "unique_for": math.nan}, "not a finite duration"),
    ({"unique_key": "k", "unique_for": 10**400}, "not a finite duration"),
    ({"unique_key": "k", "unique_for": "99999999999999999999999d"}, "at most 100 years"),
    ({"unique_key": "k\ud800"}, "lone surrogate"),
    ({"debounce": "1s", "key": "k\ud800"}, "lone surrogate"),
])
def test_windows_postgres_cannot_hold_and_unencodable_keys_are_refused(
        arguments: dict[str, Any], said: str) -> None:
    # They used to be taken: inf, nan and 1e400 as windows that fail in Postgres (or an
    # OverflowError at once), a lone surrogate as a key no header or row can hold.
    with pytest.raises(ConfigError, match=said) as refused:
        key_claim(unique_key=arguments.get("unique_key"),
                  unique_for=arguments.get("unique_for"), debounce=arguments.get("debounce"),
                  key=arguments.get("key"))
    a_sentence(refused.value)


# -- the headers a job carries from another producer: keys, workflow, tenant --------------------


@FUZZ
@given(name=st.sampled_from([HEADER_UNIQUE, HEADER_DEBOUNCE, HEADER_WORKFLOW, HEADER_TENANT]),
       raw=nasty_bytes)
def test_fuzz_the_key_workflow_and_tenant_headers(name: str, raw: bytes) -> None:
    headers = [(HEADER_JOB_ID, b"job-1"), (HEADER_TYPE, b"email.send"), (name, raw)]
    job, bad = attempt(lambda: decode_record(key=None, value=b"{}", headers=headers,
                                             expected_type="email.send", max_payload_bytes=100),
                       BadRecord)
    if job is None:
        assert bad.reason == "bad-header"
        a_sentence(bad)
        return
    text = raw.decode()
    assert control_character(text) is None  # nothing that forges a line or fails a row
    assert len(text) <= (MAX_TENANT_BYTES if name == HEADER_TENANT else MAX_ROW_TEXT_CHARS)
    assert dict(job.headers())[name] == raw  # and it goes on unchanged


@pytest.mark.parametrize("name", [HEADER_UNIQUE, HEADER_DEBOUNCE, HEADER_WORKFLOW])
@pytest.mark.parametrize("raw", [b"k\x00", b"batch:\x00", b"k\nCRITICAL forged", b"k" * 256])
def test_a_key_or_workflow_no_row_can_hold_is_a_bad_header(name: str, raw: bytes) -> None:
    # These used to decode: a NUL then failed the key's release (or the batch's counters)
    # on every try, holding the job's offset, and every release batched with it, for good.
    with pytest.raises(BadRecord) as caught:
        decode_record(key=None, value=b"{}", headers=[
            (HEADER_JOB_ID, b"job-1"), (HEADER_TYPE, b"email.send"), (name, raw)],
            expected_type="email.send", max_payload_bytes=100)
    assert caught.value.reason == "bad-header"
    assert name in str(caught.value)


@FUZZ
@given(nasty_text | st.sampled_from(["batch:", "chain:", "chain:1", "chain:x:y", "chain:-1:c",
                                     "chain:0000000001:c", "chain:9999999999:c", "batch::"]))
def test_fuzz_the_batch_and_chain_membership(text: str) -> None:
    member = parse_membership(text)
    if member is None:
        return  # garbled: the job runs as a job of its own
    assert isinstance(member, Membership)
    assert member.workflow_id
    assert 0 <= member.step < 10**9
    assert parse_membership(member.header()) == member
    previous = member.previous_step_id
    assert previous is None or len(previous) == 36


@FUZZ
@given(st.one_of(nasty_bytes, st.integers(), st.none()))
def test_fuzz_tenants(raw: Any) -> None:
    # ValueError is the header's, which the decoder makes a BadRecord.
    tenant, refused = attempt(lambda: tenant_from_header(raw) if isinstance(raw, bytes)
                              else checked_tenant(raw), ConfigError, ValueError)
    if refused is not None:
        assert str(refused)
        return
    if tenant is not None:
        assert 0 < len(tenant.encode()) <= MAX_TENANT_BYTES
        assert control_character(tenant) is None


# -- results over the limit -----------------------------------------------------------------


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


hostile_results = st.one_of(
    json_values, st.text(max_size=40), st.sampled_from(["\ud800", "\x00", "a\u0000b"]),
    st.integers(-(2**80), 2**80), st.floats(), st.sampled_from([10, 1000, 100_000]).map(_deep),
    st.builds(lambda n: "x" * n, st.sampled_from([0, 10, 1023, 1024, 1025, 10**6])),
    st.builds(lambda n: list(range(n)), st.sampled_from([10, 10_000])),
    st.sampled_from([object(), {1: 2}, {"a": {1, 2}}, b"bytes"]),
)


@FUZZ
@given(value=hostile_results, limit=st.sampled_from([0, 2, 1024, 1_000_000]))
def test_fuzz_the_result_encoder(value: Any, limit: int) -> None:
    text, refused = attempt(lambda: encode_result(value, job_type="report.build",
                                                  max_bytes=limit), ResultError)
    if text is None:
        assert ("over the limit" in str(refused)) == isinstance(refused, ResultTooLarge)
        a_sentence(refused)
        return
    assert len(text.encode()) <= limit
    assert "\\u0000" not in text
    orjson.loads(text)  # what is kept reads back


def test_a_result_one_byte_over_the_limit_is_refused_whole() -> None:
    with pytest.raises(ResultTooLarge) as caught:
        encode_result("x" * 1023, job_type="report.build", max_bytes=1024)  # 1025 with quotes
    assert str(caught.value).startswith("The report.build result is 1,025 bytes as JSON")
    assert encode_result("x" * 1022, job_type="report.build", max_bytes=1024)


# -- cancels: reasons and notices -------------------------------------------------------------


@FUZZ
@given(nasty_text)
def test_fuzz_cancel_reasons(reason: str) -> None:
    kept, refused = attempt(lambda: checked_reason(reason), ConfigError)
    if refused is not None:
        a_sentence(refused)
        return
    assert kept is None or 0 < len(kept) <= MAX_REASON_CHARS


@FUZZ
@given(payload=nasty_text, kind=st.sampled_from(list(NoticeKind)), job_id=nasty_text,
       numbers=st.tuples(st.integers(0, 2**63), st.integers(0, 2**63)))
def test_fuzz_cancel_notices(payload: str, kind: NoticeKind, job_id: str,
                             numbers: tuple[int, int]) -> None:
    parsed = parse_notice(payload)
    assert parsed is None or parsed.job_id
    if job_id:
        again = parse_notice(notice(kind, "email.send", job_id))
        assert again is not None
        assert (again.kind, again.job_id) == (kind, job_id)
        key = (job_id, *numbers)
        assert released_key(released_text(key)) == key
    released = released_key(payload)
    assert released is None or released[0]


@pytest.mark.parametrize("job_id", ["", "x" * 65, "a\nCRITICAL forged", "\udcff", "\x00"])
async def test_a_cancel_of_an_id_no_job_can_have_asks_nothing(job_id: str) -> None:
    # Refused before any scan or query: nothing listens at these addresses.
    settings = Settings(kafka_bootstrap="127.0.0.1:9",
                        database_url="postgresql://x@127.0.0.1:9/x")
    with pytest.raises(ConfigError, match=r"^No job can have the ID given") as refused:
        await cancel_job(settings, {}, job_id)
    a_sentence(refused.value)
    assert job_id not in str(refused.value) or not job_id


# -- IDs and keys given at enqueue ------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    topics = tmp_path_factory.mktemp("topics")
    (topics / "email.send.toml").write_text("partitions = 1\n")
    settings = Settings(topics_dir=Path(topics), topic_prefix="fuzz",
                        kafka_bootstrap="127.0.0.1:9")  # never dialled: prepare only
    return App(settings).client()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(job_id=st.none() | nasty_text, key=st.none() | nasty_text | nasty_bytes,
       tenant=st.none() | nasty_text)
def test_fuzz_what_enqueue_is_given(client: Any, job_id: str | None, key: Any,
                                    tenant: str | None) -> None:
    prepared, refused = attempt(lambda: client.prepare(Job("email.send", {"n": 1}, key=key,
                                                           job_id=job_id, tenant=tenant)),
                                ConfigError)
    if prepared is None:
        a_sentence(refused)
        return
    record = prepared[1]
    headers = record.headers()
    assert isinstance(record, JobRecord)
    assert decode_record(key=record.key, value=record.payload, headers=headers,
                         expected_type="email.send", max_payload_bytes=100) == record


@pytest.mark.parametrize("field", ["job_id", "key"])
def test_a_lone_surrogate_in_a_job_id_or_key_is_refused_with_a_sentence(client: Any,
                                                                        field: str) -> None:
    # It used to pass the checks and raise UnicodeEncodeError when the record was made.
    given: dict[str, Any] = {field: "abc\ud800"}
    with pytest.raises(ConfigError, match="lone surrogate") as refused:
        client.prepare(Job("email.send", {"n": 1}, **given))
    a_sentence(refused.value)


@pytest.mark.parametrize("workflow_id", ["a\tb", "\x00", "b\ud800", "x\n"])
def test_a_batch_id_its_members_header_cannot_carry_is_refused_when_it_is_made(
        workflow_id: str) -> None:
    # The decoder dead-letters an sj-workflow header with a control character: a batch
    # made with one would have every member dead-lettered (a NUL failed at Postgres).
    with pytest.raises(ConfigError) as refused:
        check_workflow_id(workflow_id)
    a_sentence(refused.value)
    assert check_workflow_id("orders:2026-05/42") == "orders:2026-05/42"


@pytest.mark.parametrize("workflow_id", ["\x00", "a\x00b", "\udcff"])
async def test_progress_of_an_id_no_row_can_hold_is_unknown_without_asking(
        workflow_id: str) -> None:
    # It used to reach Postgres, which refused the text: a 503 "Postgres failed".
    settings = Settings(database_url="postgresql://x@127.0.0.1:9/x")  # nothing listens
    with pytest.raises(UnknownWorkflow, match=r"^No batch or chain has the ID given"):
        await read_progress(settings, workflow_id)
