from __future__ import annotations

import itertools
import os
import pickle
import re
import threading
import time
import traceback
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from stream_jobs.errors import BadRecord, PayloadError, StreamJobsError
from stream_jobs.failures import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, FailureInfo, parse_failure
from stream_jobs.job_ids import (
    ID_RANDOM_CHUNK,
    JobIdSource,
    control_character,
    job_id_time_ms,
    new_job_id,
)
from stream_jobs.naming import LANES
from stream_jobs.payloads import encode_payload
from stream_jobs.record import (
    HEADER_ATTEMPT,
    HEADER_ENQUEUED_AT,
    HEADER_ERROR,
    HEADER_EXPIRES_AT,
    HEADER_JOB_ID,
    HEADER_LANE,
    HEADER_NOT_BEFORE,
    HEADER_ORIGIN,
    HEADER_REQUEUES,
    HEADER_RERUN_OF,
    HEADER_TRACEPARENT,
    HEADER_TYPE,
    JobRecord,
    dead_letter_origin,
    decode_payload,
    decode_record,
    parse_origin,
)

FUZZ = settings(max_examples=200, deadline=None)
PROPERTY = settings(max_examples=200, deadline=None)

ALL_HEADERS = (
    HEADER_JOB_ID,
    HEADER_TYPE,
    HEADER_ATTEMPT,
    HEADER_ENQUEUED_AT,
    HEADER_NOT_BEFORE,
    HEADER_EXPIRES_AT,
    HEADER_LANE,
    HEADER_ORIGIN,
    HEADER_ERROR,
    HEADER_REQUEUES,
    HEADER_RERUN_OF,
    HEADER_TRACEPARENT,
)
UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
INT64 = 2**63 - 1
LIMIT = 1_000_000

# Strings that can travel as UTF-8 (lone surrogates cannot).
texts = st.text(st.characters(codec="utf-8"), max_size=40)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=8,
)
failures = st.builds(
    FailureInfo,
    reason=texts,
    error_class=texts,
    message=texts,
    traceback=texts,
    failed_at_ms=st.integers(-(2**63), INT64),
    worker_id=st.none() | texts,
    started_at_ms=st.none() | st.integers(0, INT64),
    duration_ms=st.none() | st.integers(0, INT64),
)
records = st.builds(
    JobRecord,
    job_id=texts.filter(lambda t: bool(t) and control_character(t) is None),
    job_type=texts,
    payload=json_values.map(orjson.dumps),
    key=st.none() | st.binary(max_size=32),
    attempt=st.integers(1, INT64),
    enqueued_at_ms=st.integers(0, INT64),
    not_before_ms=st.none() | st.integers(0, INT64),
    expires_at_ms=st.none() | st.integers(0, INT64),
    lane=st.sampled_from(LANES),
    origin=st.none() | texts,
    failure=st.none() | failures,
    requeues=st.integers(0, INT64),
    rerun_of=st.none() | texts,
    traceparent=st.none() | texts,
    # The client refuses control characters in keys; the decoder, from elsewhere, too.
    unique_key=st.none() | texts.filter(lambda t: control_character(t) is None),
    debounce_key=st.none() | texts.filter(lambda t: control_character(t) is None),
)


def decode(
    value: bytes | None = b"{}",
    headers: list[tuple[str, bytes]] | None = None,
    *,
    key: bytes | None = None,
    expected_type: str = "email.send",
    max_payload_bytes: int = LIMIT,
) -> JobRecord:
    if headers is None:
        headers = [(HEADER_JOB_ID, b"job-1"), (HEADER_TYPE, b"email.send")]
    return decode_record(
        key=key,
        value=value,
        headers=headers,
        expected_type=expected_type,
        max_payload_bytes=max_payload_bytes,
    )


def base_headers(**extra: bytes) -> list[tuple[str, bytes]]:
    headers = [(HEADER_JOB_ID, b"job-1"), (HEADER_TYPE, b"email.send")]
    return headers + [(name, raw) for name, raw in extra.items()]


def reason_of(value: bytes | None, headers: list[tuple[str, bytes]], **kw: Any) -> str:
    with pytest.raises(BadRecord) as caught:
        decode(value, headers, **kw)
    assert str(caught.value).endswith(".")  # a sentence, for the DLQ and the logs
    return caught.value.reason


# -- the round trip -------------------------------------------------------------------


@PROPERTY
@given(records)
def test_every_record_survives_headers_and_decode(record: JobRecord) -> None:
    decoded = decode_record(
        key=record.key,
        value=record.payload,
        headers=record.headers(),
        expected_type=record.job_type,
        max_payload_bytes=len(record.payload),
    )
    assert decoded == record


@PROPERTY
@given(records)
def test_headers_are_str_names_and_bytes_values_without_nones(record: JobRecord) -> None:
    headers = record.headers()
    names = [name for name, _ in headers]
    assert len(names) == len(set(names))
    assert all(isinstance(name, str) and isinstance(raw, bytes) for name, raw in headers)
    optional = {
        HEADER_NOT_BEFORE: record.not_before_ms,
        HEADER_EXPIRES_AT: record.expires_at_ms,
        HEADER_ORIGIN: record.origin,
        HEADER_ERROR: record.failure,
        HEADER_RERUN_OF: record.rerun_of,
        HEADER_TRACEPARENT: record.traceparent,
    }
    for name, field_value in optional.items():
        assert (name in names) == (field_value is not None)


def test_header_spelling_matches_the_wire_contract() -> None:
    record = JobRecord(
        job_id="j",
        job_type="email.send",
        payload=b"{}",
        key=b"k",
        attempt=3,
        enqueued_at_ms=1_700_000_000_000,
        not_before_ms=1_700_000_005_000,
        expires_at_ms=1_700_003_600_000,
        lane="high",
        origin="jobs.email.send/3/42",
        requeues=1,
        rerun_of="old",
        traceparent="00-abc-def-01",
    )
    assert dict(record.headers()) == {
        "sj-job-id": b"j",
        "sj-type": b"email.send",
        "sj-attempt": b"3",
        "sj-enqueued-at": b"1700000000000",
        "sj-not-before": b"1700000005000",
        "sj-expires-at": b"1700003600000",
        "sj-lane": b"high",
        "sj-origin": b"jobs.email.send/3/42",
        "sj-requeues": b"1",
        "sj-rerun-of": b"old",
        "traceparent": b"00-abc-def-01",
    }


def test_minimal_headers_take_the_defaults() -> None:
    record = decode(b'{"to": "a@b"}', key=b"user-42")
    assert record == JobRecord(
        job_id="job-1", job_type="email.send", payload=b'{"to": "a@b"}', key=b"user-42"
    )
    assert record.attempt == 1
    assert record.lane == "default"
    assert record.failure is None


def test_payload_bytes_are_kept_exactly_as_sent() -> None:
    raw = b'  {"b": 1.50, "a": [1, 2]}\n'
    assert decode(raw).payload == raw
    assert decode_payload(decode(raw)) == {"b": 1.5, "a": [1, 2]}


def test_with_changes_fields_and_keeps_the_rest() -> None:
    record = JobRecord(job_id="j", job_type="t", payload=b"{}", key=None)
    retried = record.with_(attempt=2, not_before_ms=5)
    assert (retried.attempt, retried.not_before_ms, retried.job_id) == (2, 5, "j")
    assert record.attempt == 1


# -- every reason a record is not a job -----------------------------------------------


def test_no_value_is_missing_value() -> None:
    assert reason_of(None, base_headers()) == "missing-value"


def test_value_over_the_limit_is_too_large_and_at_the_limit_is_fine() -> None:
    assert reason_of(b"[1, 2]", base_headers(), max_payload_bytes=5) == "too-large"
    assert decode(b"[1,2]", base_headers(), max_payload_bytes=5).payload == b"[1,2]"


@pytest.mark.parametrize("missing", [HEADER_JOB_ID, HEADER_TYPE])
def test_no_job_id_or_type_is_missing_header(missing: str) -> None:
    headers = [(n, v) for n, v in base_headers() if n != missing]
    assert reason_of(b"{}", headers) == "missing-header"


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        (HEADER_JOB_ID, b""),
        (HEADER_JOB_ID, b"\xff\xfe"),
        (HEADER_JOB_ID, b"abc\nCRITICAL forged"),
        (HEADER_JOB_ID, b"a\x1b[31mb"),
        (HEADER_JOB_ID, "a\u2028b".encode()),
        (HEADER_JOB_ID, "a\x85b".encode()),
        (HEADER_TYPE, b"email.\xc3"),
        (HEADER_ATTEMPT, b"0"),
        (HEADER_ATTEMPT, b"-1"),
        (HEADER_ATTEMPT, b"two"),
        (HEADER_ATTEMPT, b""),
        (HEADER_ATTEMPT, b" 2"),
        (HEADER_ATTEMPT, b"+2"),
        (HEADER_ATTEMPT, b"1_000"),
        (HEADER_ATTEMPT, "\u0663".encode()),  # an Arabic-Indic digit: int() would take it
        (HEADER_ENQUEUED_AT, b"1.5"),
        (HEADER_ENQUEUED_AT, b"9" * 19),  # beyond int64
        (HEADER_ENQUEUED_AT, b"1" * 5000),
        (HEADER_NOT_BEFORE, b"-5"),
        (HEADER_EXPIRES_AT, b"soon"),
        (HEADER_REQUEUES, b"-1"),
        (HEADER_LANE, b"urgent"),
        (HEADER_LANE, b"\x80"),
        (HEADER_ORIGIN, b"\xff"),
        (HEADER_RERUN_OF, b"\xc0\xaf"),
    ],
)
def test_malformed_headers_are_bad_header(name: str, raw: bytes) -> None:
    headers = [(n, v) for n, v in base_headers() if n != name] + [(name, raw)]
    assert reason_of(b"{}", headers) == "bad-header"


def test_a_job_id_with_a_slash_from_another_producer_is_a_job() -> None:
    # The gateway's routes cannot name it, but `stream-jobs job ID` can: no reason to lose it.
    headers = [(HEADER_JOB_ID, b"orders/42"), (HEADER_TYPE, b"email.send")]
    assert decode(b"{}", headers).job_id == "orders/42"


def test_a_header_without_a_value_is_bad_header() -> None:
    headers: list[Any] = [*base_headers(), (HEADER_ATTEMPT, None)]
    assert reason_of(b"{}", headers) == "bad-header"


def test_a_job_of_another_type_is_wrong_type() -> None:
    assert reason_of(b"{}", base_headers(), expected_type="sms.send") == "wrong-type"


@pytest.mark.parametrize(
    "value", [b"", b"{", b"{'a': 1}", b"\xff", b"[1,]", b"NaN", b"[" * 2000 + b"]" * 2000]
)
def test_a_value_that_is_not_json_is_bad_json(value: bytes) -> None:
    assert reason_of(value, base_headers()) == "bad-json"


def test_reasons_are_checked_in_the_documented_order() -> None:
    bad_everything = [(HEADER_TYPE, b"other"), (HEADER_ATTEMPT, b"x")]
    assert reason_of(b"x" * 10, bad_everything, max_payload_bytes=5) == "too-large"
    assert reason_of(b"not json", bad_everything) == "missing-header"
    bad_header = [(HEADER_JOB_ID, b"j"), *bad_everything]
    assert reason_of(b"not json", bad_header) == "bad-header"
    wrong_type = [(HEADER_JOB_ID, b"j"), (HEADER_TYPE, b"other")]
    assert reason_of(b"not json", wrong_type) == "wrong-type"


def test_when_a_header_repeats_the_last_one_wins() -> None:
    headers = [*base_headers(), (HEADER_ATTEMPT, b"2"), (HEADER_ATTEMPT, b"3")]
    assert decode(b"{}", headers).attempt == 3
    assert decode(b"{}", [(HEADER_ATTEMPT, b"bad"), *headers]).attempt == 3
    headers = [(HEADER_TYPE, b"other"), *base_headers()]
    assert decode(b"{}", headers).job_type == "email.send"


def test_a_garbled_error_header_loses_the_history_not_the_job() -> None:
    record = decode(b"{}", base_headers(**{HEADER_ERROR: b"\xff{not json"}))
    assert record.failure is None


def test_a_garbled_traceparent_is_dropped_not_fatal() -> None:
    record = decode(b"{}", base_headers(**{HEADER_TRACEPARENT: b"\xff\x00"}))
    assert record.traceparent is None


def test_unknown_and_malformed_header_items_are_ignored() -> None:
    headers: list[Any] = [*base_headers(), ("x-other", b"\xff"), ("lonely",), 42, (None, b"")]
    assert decode(b"{}", headers).job_id == "job-1"


def test_bytes_like_values_are_accepted() -> None:
    headers: list[Any] = [(HEADER_JOB_ID, bytearray(b"j")), (HEADER_TYPE, memoryview(b"t"))]
    record = decode(bytearray(b"[]"), headers, expected_type="t", key=memoryview(b"k"))  # type: ignore[arg-type]
    assert (record.job_id, record.payload, record.key) == ("j", b"[]", b"k")
    assert type(record.payload) is bytes


def test_bad_record_is_a_stream_jobs_error_that_pickles() -> None:
    bad = BadRecord("bad-json", "The payload is not valid JSON.")
    assert isinstance(bad, StreamJobsError)
    copy = pickle.loads(pickle.dumps(bad))
    assert (copy.reason, str(copy)) == ("bad-json", "The payload is not valid JSON.")


def test_decode_payload_of_a_hand_made_record_raises_bad_record() -> None:
    with pytest.raises(BadRecord) as caught:
        decode_payload(JobRecord(job_id="j", job_type="t", payload=b"{", key=None))
    assert caught.value.reason == "bad-json"


# -- fuzz: any input decodes or raises BadRecord, nothing else ------------------------

garbage_values = st.none() | st.binary(max_size=64) | json_values.map(orjson.dumps)
header_names = st.sampled_from(ALL_HEADERS) | st.text(max_size=12)
header_values = (
    st.binary(max_size=24)
    | st.integers(-(10**20), 10**20).map(lambda n: str(n).encode())
    | st.sampled_from([b"email.send", b"high", b"low", b"default", b"1", b"0"])
)
header_lists = st.lists(st.tuples(header_names, header_values), max_size=10)


def decodes_or_bad_record(**kwargs: Any) -> None:
    reason: str | None = None
    try:
        record = decode_record(**kwargs)
    except BadRecord as bad:
        reason = bad.reason
    else:
        assert isinstance(record, JobRecord)
        assert record.attempt >= 1
        assert record.lane in LANES
        orjson.loads(record.payload)
    assert reason in {
        None,
        "missing-value",
        "too-large",
        "missing-header",
        "bad-header",
        "wrong-type",
        "bad-json",
    }


@FUZZ
@given(
    key=st.none() | st.binary(max_size=16),
    value=garbage_values,
    headers=header_lists,
    max_payload_bytes=st.integers(0, 100),
)
def test_fuzz_any_bytes_and_headers(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], max_payload_bytes: int
) -> None:
    decodes_or_bad_record(
        key=key,
        value=value,
        headers=headers,
        expected_type="email.send",
        max_payload_bytes=max_payload_bytes,
    )


@FUZZ
@given(
    records,
    st.lists(st.tuples(header_names, header_values), max_size=4),
    st.data(),
)
def test_fuzz_valid_records_with_corrupted_headers(
    record: JobRecord, corruption: list[tuple[str, bytes]], data: st.DataObject
) -> None:
    # Start from a valid record so the fuzz reaches the checks after missing-header.
    headers = record.headers()
    drop = data.draw(st.sets(st.sampled_from([n for n, _ in headers])))
    headers = [(n, v) for n, v in headers if n not in drop] + corruption
    decodes_or_bad_record(
        key=record.key,
        value=record.payload,
        headers=headers,
        expected_type=record.job_type,
        max_payload_bytes=LIMIT,
    )


weird_items = st.one_of(
    st.tuples(header_names, st.none() | st.integers() | st.text(max_size=4) | st.binary()),
    st.tuples(st.none() | st.integers() | st.binary(max_size=4), st.binary(max_size=4)),
    st.tuples(header_names),
    st.tuples(header_names, st.binary(max_size=4), st.binary(max_size=4)),
    st.integers(),
    st.none(),
)


@FUZZ
@given(
    key=st.none() | st.binary(max_size=4) | st.text(max_size=4) | st.integers(0, 5),
    value=garbage_values | st.text(max_size=8) | st.integers(0, 5),
    headers=st.lists(weird_items, max_size=6).map(lambda items: [*base_headers(), *items])
    | st.none(),
)
def test_fuzz_inputs_of_the_wrong_types(key: Any, value: Any, headers: Any) -> None:
    decodes_or_bad_record(
        key=key, value=value, headers=headers, expected_type="email.send", max_payload_bytes=64
    )


# -- failures ---------------------------------------------------------------------------


@PROPERTY
@given(failures)
def test_failure_json_round_trips(failure: FailureInfo) -> None:
    assert FailureInfo.from_json(failure.to_json()) == failure
    assert parse_failure(failure.to_json()) == failure


def test_a_failure_header_without_the_run_fields_still_parses() -> None:
    old = (b'{"reason":"handler-error","error_class":"ValueError","message":"m",'
           b'"traceback":"t","failed_at_ms":5}')
    failure = parse_failure(old)
    assert failure == FailureInfo("handler-error", "ValueError", "m", "t", 5)
    assert failure.worker_id is None
    assert failure.duration_ms is None
    assert failure.to_json() == old  # nothing unknown is written back


def test_a_failed_run_names_its_worker_start_and_duration() -> None:
    failure = FailureInfo.from_exception(ValueError("no"), "handler-error", 1_500,
                                         worker_id="host-1-abc", started_at_ms=1_000)
    assert (failure.worker_id, failure.started_at_ms, failure.duration_ms) == (
        "host-1-abc", 1_000, 500)
    assert parse_failure(failure.to_json()) == failure
    odd = orjson.loads(failure.to_json()) | {"worker_id": 7, "duration_ms": "long"}
    parsed = parse_failure(orjson.dumps(odd))
    assert parsed is not None
    assert parsed.worker_id is None
    assert parsed.duration_ms is None


@FUZZ
@given(st.none() | st.binary(max_size=64) | json_values.map(orjson.dumps))
def test_parse_failure_never_raises(raw: bytes | None) -> None:
    result = parse_failure(raw)
    assert result is None or isinstance(result, FailureInfo)


@pytest.mark.parametrize(
    "raw",
    [
        b"[]",
        b'{"reason": "x"}',
        b'{"reason": 1, "error_class": "", "message": "", "traceback": "", "failed_at_ms": 1}',
        b'{"reason": "", "error_class": "", "message": "", "traceback": "", "failed_at_ms": true}',
        b'{"reason": "", "error_class": "", "message": "", "traceback": "", "failed_at_ms": 1.5}',
    ],
)
def test_parse_failure_rejects_the_wrong_shape(raw: bytes) -> None:
    assert parse_failure(raw) is None
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError: the shape is wrong
        FailureInfo.from_json(raw)


def test_parse_failure_ignores_fields_it_does_not_know() -> None:
    raw = b'{"reason":"timeout","error_class":"E","message":"m","traceback":"",'
    raw += b'"failed_at_ms":7,"host":"w1"}'
    assert parse_failure(raw) == FailureInfo("timeout", "E", "m", "", 7)


def _raise_deep(depth: int) -> None:
    if depth == 0:
        raise ValueError("at the bottom")
    _raise_deep(depth - 1)


def test_from_exception_describes_the_error() -> None:
    try:
        _raise_deep(3)
    except ValueError as exc:
        failure = FailureInfo.from_exception(exc, "handler-error", 1234)
    assert failure.reason == "handler-error"
    assert failure.error_class == "ValueError"
    assert failure.message == "at the bottom"
    assert "_raise_deep" in failure.traceback
    assert failure.traceback.rstrip().endswith("ValueError: at the bottom")
    assert failure.failed_at_ms == 1234


def test_from_exception_names_non_builtin_classes_with_their_module() -> None:
    failure = FailureInfo.from_exception(BadRecord("bad-json", "no"), "bad-json", 0)
    assert failure.error_class == "stream_jobs.errors.BadRecord"


def _long_chain(links: int) -> ValueError:
    # Python folds repeated frames, so a long traceback needs distinct chained errors.
    error: ValueError | None = None
    for i in range(links):
        try:
            raise ValueError(f"link {i}") from error
        except ValueError as exc:
            error = exc
    try:
        _raise_deep(2)
    except ValueError as exc:
        exc.__cause__ = error
        return exc
    raise AssertionError("unreachable")


def test_from_exception_keeps_the_last_lines_of_a_long_traceback() -> None:
    exc = _long_chain(100)
    assert len("".join(traceback.format_exception(exc))) > 3 * MAX_TRACEBACK_CHARS
    failure = FailureInfo.from_exception(exc, "handler-error", 0)
    assert len(failure.traceback) <= MAX_TRACEBACK_CHARS
    assert failure.traceback.startswith("…\n")
    assert failure.traceback.rstrip().endswith("ValueError: at the bottom")
    # Whole lines only, apart from the cut marker: the kept text is a tail of the full trace
    # that starts at a line boundary (where the cut lands depends on the checkout's path).
    full = "".join(traceback.format_exception(exc))
    kept = failure.traceback.removeprefix("…\n")
    assert full.rstrip().endswith(kept.rstrip())
    assert full[: len(full.rstrip()) - len(kept.rstrip())].endswith("\n")


def test_from_exception_cuts_a_long_message_and_a_single_huge_line() -> None:
    failure = FailureInfo.from_exception(ValueError("x" * 50_000), "handler-error", 0)
    assert len(failure.message) == MAX_MESSAGE_CHARS
    assert failure.message.endswith("…")
    assert len(failure.traceback) <= MAX_TRACEBACK_CHARS
    assert failure.traceback.endswith("x\n")


def test_from_exception_survives_surrogates_and_broken_str() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    text = b"caf\xe9".decode("utf-8", "surrogateescape")
    failure = FailureInfo.from_exception(ValueError(text), "handler-error", 0)
    assert parse_failure(failure.to_json()) == failure
    broken = FailureInfo.from_exception(Unprintable(), "handler-error", 0)
    assert "unprintable" in broken.message
    assert parse_failure(broken.to_json()) == broken


def test_to_json_survives_surrogates_in_a_hand_made_failure() -> None:
    failure = FailureInfo("handler-error", "E", "bad \ud800 text", "", 0)
    parsed = parse_failure(failure.to_json())
    assert parsed is not None
    assert parsed.message == "bad ? text"


# -- job IDs ----------------------------------------------------------------------------


def test_job_ids_are_uuid7_with_the_current_time() -> None:
    before = time.time_ns() // 1_000_000
    job_id = new_job_id()
    after = time.time_ns() // 1_000_000
    assert UUID7.match(job_id)
    parsed = uuid.UUID(job_id)
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    time_ms = job_id_time_ms(job_id)
    assert time_ms is not None
    assert before <= time_ms <= after


def test_job_ids_sort_in_creation_order() -> None:
    ids = [new_job_id() for _ in range(20_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_ids_within_one_millisecond_count_up_and_borrow_the_next_on_overflow() -> None:
    source = JobIdSource()
    ids = [source.next_id(1_000) for _ in range(5_000)]  # more than the 12-bit counter holds
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert job_id_time_ms(ids[0]) == 1_000
    assert job_id_time_ms(ids[-1]) == 1_001
    assert all(UUID7.match(i) for i in ids)


def test_a_clock_stepping_back_does_not_reorder_ids() -> None:
    source = JobIdSource()
    first = source.next_id(10_000)
    second = source.next_id(9_000)
    assert second > first
    assert job_id_time_ms(second) == 10_000


@PROPERTY
@given(st.lists(st.integers(0, 2**48 - 2), min_size=1, max_size=200))
def test_ids_strictly_increase_whatever_the_clock_does(clock: list[int]) -> None:
    source = JobIdSource()
    ids = [source.next_id(now) for now in clock]
    assert all(a < b for a, b in itertools.pairwise(ids))
    for now, job_id in zip(clock, ids, strict=True):
        assert UUID7.match(job_id)
        time_ms = job_id_time_ms(job_id)
        assert time_ms is not None
        assert time_ms >= now


def test_ids_from_many_threads_are_unique() -> None:
    source = JobIdSource()
    out: list[list[str]] = [[] for _ in range(8)]

    def make(bucket: list[str]) -> None:
        bucket.extend(source.next_id(5) for _ in range(2_000))

    threads = [threading.Thread(target=make, args=(bucket,)) for bucket in out]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [i for bucket in out for i in bucket]
    assert len(set(everything)) == len(everything)
    assert all(bucket == sorted(bucket) for bucket in out)


@pytest.mark.parametrize(
    "job_id",
    # A fixed UUIDv4: a fresh one per collection differs between xdist's workers.
    ["", "job-1", "d03ebcd5-b754-459a-aaa4-8bf99e5da075", "0189c2d6-6f2a-7abc-cdef-0123456789ab",
     "x" * 36],
)
def test_job_id_time_ms_is_none_for_other_ids(job_id: str) -> None:
    assert job_id_time_ms(job_id) is None


@FUZZ
@given(st.text(max_size=40))
def test_job_id_time_ms_never_raises(text: str) -> None:
    assert job_id_time_ms(text) is None or UUID7.match(text.lower())


# -- payloads ---------------------------------------------------------------------------


class Email(BaseModel):
    to: str
    subject: str


class Batch(BaseModel):
    emails: list[Email]


@PROPERTY
@given(json_values)
def test_json_values_encode_and_decode_back(value: Any) -> None:
    data = encode_payload(value)
    assert orjson.loads(data) == value
    record = decode(data)
    assert decode_payload(record) == value


def test_models_encode_as_their_json_dump() -> None:
    assert orjson.loads(encode_payload(Email(to="a@b", subject="hi"))) == {
        "to": "a@b",
        "subject": "hi",
    }
    batch = Batch(emails=[Email(to="a", subject="s")])
    assert orjson.loads(encode_payload(batch)) == {"emails": [{"to": "a", "subject": "s"}]}
    nested = {"first": Email(to="a", subject="s"), "more": [Email(to="b", subject="t")]}
    assert orjson.loads(encode_payload(nested)) == {
        "first": {"to": "a", "subject": "s"},
        "more": [{"to": "b", "subject": "t"}],
    }


@pytest.mark.parametrize(
    "value",
    [b"raw", {"a": b"raw"}, {1, 2}, {1: "int key"}, 2**70, object(), {"x": object()}],
)
def test_values_json_cannot_hold_are_payload_errors(value: object) -> None:
    with pytest.raises(PayloadError) as caught:
        encode_payload(value)
    assert str(caught.value).endswith(".")


def test_payload_over_max_bytes_is_a_payload_error() -> None:
    assert encode_payload({"a": 1}, max_bytes=7) == b'{"a":1}'
    with pytest.raises(PayloadError, match="over the limit of 6"):
        encode_payload({"a": 1}, max_bytes=6)


# -- origins ----------------------------------------------------------------------------


def test_origin_spelling() -> None:
    assert dead_letter_origin("jobs.email.send", 3, 42) == "jobs.email.send/3/42"
    assert parse_origin("jobs.email.send/3/42") == ("jobs.email.send", 3, 42)


@PROPERTY
@given(texts.filter(bool), st.integers(0, 2**31 - 1), st.integers(0, INT64))
def test_origins_round_trip(topic: str, partition: int, offset: int) -> None:
    assert parse_origin(dead_letter_origin(topic, partition, offset)) == (topic, partition, offset)


@pytest.mark.parametrize(
    "text", ["", "topic", "topic/1", "/1/2", "t/-1/2", "t/1/x", "t/1/2.0", "t/ 1/2", "t/1/"]
)
def test_malformed_origins_are_none(text: str) -> None:
    assert parse_origin(text) is None


@FUZZ
@given(st.text(max_size=30))
def test_parse_origin_never_raises(text: str) -> None:
    parsed = parse_origin(text)
    assert parsed is None or dead_letter_origin(*parsed) == text


def test_random_bits_never_repeat_across_the_urandom_chunks() -> None:
    source = JobIdSource()
    # Each ID in its own millisecond, so the counter is seeded from fresh bits every time.
    ids = [source.next_id(1_000 + i) for i in range(3 * ID_RANDOM_CHUNK + 7)]
    tails = [i.rsplit("-", 1)[-1] for i in ids]
    assert len(set(tails)) == len(tails)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_reuse_its_parents_random_bits() -> None:
    source = JobIdSource()
    source.next_id(1)  # the parent now holds a chunk of random bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the same state, the same clock
        try:
            os.write(write, source.next_id(2).encode())
        finally:
            os._exit(0)
    os.close(write)
    child_id = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert UUID7.match(child_id)
    assert child_id != source.next_id(2)


class _SwitchAfterRelease:
    """Stands in for a JobIdSource's lock: right after each release another caller takes
    an ID, as a thread switch at that point would."""

    def __init__(self, source: JobIdSource) -> None:
        self.source = source
        self.others: list[str] = []
        self.inside = False

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        if not self.inside:
            self.inside = True
            self.others.append(self.source.next_id(5))
            self.inside = False


def test_an_id_is_made_from_what_its_own_turn_under_the_lock_saw() -> None:
    source = JobIdSource()
    switch = _SwitchAfterRelease(source)
    source._lock = switch  # type: ignore[assignment]
    mine = source.next_id(5)
    other = switch.others[0]
    # The counter (the 12 bits after the version digit) differs and orders the two.
    assert mine[15:18] != other[15:18]
    assert mine < other
