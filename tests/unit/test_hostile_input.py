"""Hostile input: whatever arrives from the broker decodes, or is dead-lettered with a reason.

Adds to the fuzzing of `decode_record` in test_record.py: header lists of mixed types and
huge values, the size limit checked before anything is parsed, the dead-letter headers of
garbage, failures of hostile exceptions, the handler's payload parser, the worker's whole
path for one record (no broker: its writes are captured), and a scan of the package for
anything that unpickles or evaluates. Every property runs a fixed number of examples.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from stream_jobs.app import App
from stream_jobs.errors import BadRecord
from stream_jobs.failures import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, FailureInfo, parse_failure
from stream_jobs.handlers import JobHandler
from stream_jobs.job_ids import MAX_JOB_ID_BYTES
from stream_jobs.job_types import load_job_types
from stream_jobs.naming import LANES
from stream_jobs.record import (
    HEADER_ATTEMPT,
    HEADER_ERROR,
    HEADER_JOB_ID,
    HEADER_ORIGIN,
    HEADER_TYPE,
    JobRecord,
    dead_letter_headers,
    decode_record,
)
from stream_jobs.runtime.dispatch import Runner
from stream_jobs.settings import Settings

from .test_record import ALL_HEADERS, json_values

PACKAGE = Path(__file__).resolve().parents[2] / "stream_jobs"
FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DECODE_REASONS = {"missing-value", "too-large", "missing-header", "bad-header", "wrong-type",
                  "bad-json"}
CANARY = "canary-payload-7f3a9c"

# Sizes around every limit the decoder has, and a few that are simply big.
SIZES = [0, 1, 19, 20, 64, 255, MAX_JOB_ID_BYTES, MAX_JOB_ID_BYTES + 1, 4096, 65_536,
         1_048_576]
big_bytes = st.builds(lambda size, fill: fill * size, st.sampled_from(SIZES),
                      st.sampled_from([b"9", b"a", b"\xff", b"{", b"\x00"]))
any_value = st.one_of(
    st.binary(max_size=64), big_bytes, st.text(max_size=8), st.integers(), st.none(),
    st.binary(max_size=8).map(bytearray), st.binary(max_size=8).map(memoryview),
    st.lists(st.integers(0, 255), max_size=4), st.floats(),
)
any_name = st.one_of(st.sampled_from(ALL_HEADERS), st.text(max_size=12),
                     st.binary(max_size=8), st.none(), st.integers())
any_item = st.one_of(
    st.tuples(any_name, any_value),
    st.tuples(st.sampled_from(ALL_HEADERS), big_bytes),
    st.tuples(any_name), st.tuples(any_name, any_value, any_value),
    st.lists(st.binary(max_size=4), max_size=3), st.none(), st.integers(), st.text(max_size=4),
)
valid_start = st.just([(HEADER_JOB_ID, b"job-1"), (HEADER_TYPE, b"email.send")])
any_headers = st.one_of(
    st.lists(any_item, max_size=12),
    st.builds(lambda start, rest: [*start, *rest], valid_start, st.lists(any_item, max_size=8)),
    st.none(), st.tuples(), st.text(max_size=4),
)


def decodes_or_bad_record(**kwargs: Any) -> JobRecord | None:
    """Decode; a BadRecord must carry a known reason and a one-sentence message."""
    try:
        record = decode_record(**kwargs)
    except BadRecord as bad:
        refused: BadRecord = bad
    else:
        refused = BadRecord("", "")
    if refused.reason:
        assert refused.reason in DECODE_REASONS
        assert str(refused).endswith(".")
        return None
    assert isinstance(record.payload, bytes)
    assert record.key is None or isinstance(record.key, bytes)
    assert 0 < len(record.job_id.encode()) <= MAX_JOB_ID_BYTES
    assert record.attempt >= 1
    assert record.lane in LANES
    return record


# -- the decoder and the header parser ---------------------------------------------------


@FUZZ
@given(key=any_value, value=st.one_of(st.binary(max_size=64), big_bytes, any_value,
                                      json_values.map(orjson.dumps)),
       headers=any_headers, limit=st.sampled_from([0, 1, 64, 4096, 2_000_000]))
def test_fuzz_mixed_header_lists_and_huge_values(key: Any, value: Any, headers: Any,
                                                 limit: int) -> None:
    decodes_or_bad_record(key=key, value=value, headers=headers, expected_type="email.send",
                          max_payload_bytes=limit)


class _Untouchable:
    """Fails the test if the decoder looks at it at all."""

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("the headers were read before the size check")

    def __len__(self) -> int:
        raise AssertionError("the headers were read before the size check")


def test_an_oversized_value_is_refused_before_anything_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NoParsing:
        @staticmethod
        def loads(_: object) -> object:
            raise AssertionError("the payload was parsed before the size check")

    monkeypatch.setattr("stream_jobs.record.orjson", NoParsing)
    value = b"[" * (8 * 1024 * 1024)  # nested past any parser's depth, and 8 MiB
    with pytest.raises(BadRecord) as caught:
        decode_record(key=None, value=value, headers=_Untouchable(),  # type: ignore[arg-type]
                      expected_type="email.send", max_payload_bytes=1_048_576)
    assert caught.value.reason == "too-large"
    assert str(caught.value) == ("The payload is 8388608 bytes, over the limit of 1048576.")


@FUZZ
@given(value=st.binary(min_size=1, max_size=256), limit=st.integers(0, 255),
       headers=any_headers)
def test_anything_over_the_limit_is_too_large_whatever_its_headers(
    value: bytes, limit: int, headers: Any,
) -> None:
    if len(value) <= limit:
        value = value * (limit // len(value) + 1)
    with pytest.raises(BadRecord) as caught:
        decode_record(key=None, value=value, headers=headers, expected_type="email.send",
                      max_payload_bytes=limit)
    assert caught.value.reason == "too-large"


@pytest.mark.parametrize("size", [MAX_JOB_ID_BYTES + 1, 1_048_576])
def test_a_huge_job_id_is_a_bad_header_that_does_not_quote_it(size: int) -> None:
    headers = [(HEADER_JOB_ID, b"x" * size), (HEADER_TYPE, b"email.send")]
    with pytest.raises(BadRecord) as caught:
        decode_record(key=None, value=b"{}", headers=headers, expected_type="email.send",
                      max_payload_bytes=100)
    assert caught.value.reason == "bad-header"
    assert len(str(caught.value)) < 200


def test_huge_integers_and_nesting_in_headers_are_refused_cheaply() -> None:
    base = [(HEADER_JOB_ID, b"j"), (HEADER_TYPE, b"email.send")]
    with pytest.raises(BadRecord) as caught:
        decode_record(key=None, value=b"{}", headers=[*base, (HEADER_ATTEMPT, b"9" * 1_048_576)],
                      expected_type="email.send", max_payload_bytes=100)
    assert caught.value.reason == "bad-header"
    # A failure header nested past the parser's depth only loses the job's history.
    deep = [*base, (HEADER_ERROR, b"[" * 1_048_576)]
    record = decode_record(key=None, value=b"{}", headers=deep, expected_type="email.send",
                           max_payload_bytes=100)
    assert record.failure is None


@FUZZ
@given(st.binary(max_size=256) | big_bytes | json_values.map(orjson.dumps))
def test_fuzz_the_failure_header_parser(raw: bytes) -> None:
    failure = parse_failure(raw)
    assert failure is None or isinstance(failure, FailureInfo)


# -- what a dead letter of garbage carries ----------------------------------------------


@FUZZ
@given(headers=st.lists(any_item, max_size=10) | st.none(),
       job_type=st.sampled_from(["email.send", "a.b"]))
def test_fuzz_dead_letter_headers_of_anything(headers: Any, job_type: str) -> None:
    failure = FailureInfo("bad-header", "E", "m", "", 1)
    out = dead_letter_headers(headers, failure=failure, origin="t/0/1", job_type=job_type)
    assert all(isinstance(name, str) and isinstance(raw, bytes) for name, raw in out)
    names = [name for name, _ in out]
    assert names.count(HEADER_ERROR) == 1
    assert names.count(HEADER_ORIGIN) == 1
    assert HEADER_JOB_ID in names
    assert HEADER_TYPE in names
    assert parse_failure(dict(out)[HEADER_ERROR]) == failure


class _Hostile(Exception):
    def __init__(self, text: str, broken: bool) -> None:
        super().__init__(text, object(), b"\xff")
        self.text = text
        self.broken = broken

    def __str__(self) -> str:
        if self.broken:
            raise RuntimeError("a __str__ that raises")
        return self.text


@FUZZ
@given(text=st.text(max_size=64) | st.sampled_from(["x" * 100_000, "\ud800" * 10, "\x00\n" * 50]),
       broken=st.booleans(), cycle=st.booleans())
def test_failures_of_hostile_exceptions_are_bounded_and_round_trip(
    text: str, broken: bool, cycle: bool,
) -> None:
    exc = _Hostile(text, broken)
    if cycle:  # cause and context pointing at each other
        other = ValueError("other")
        exc.__cause__ = other
        other.__context__ = exc
    failure = FailureInfo.from_exception(exc, "handler-error", 0)
    assert len(failure.message) <= MAX_MESSAGE_CHARS
    assert len(failure.traceback) <= MAX_TRACEBACK_CHARS
    assert parse_failure(failure.to_json()) is not None


# -- the handler's payload parser ---------------------------------------------------------


class Email(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    to: str
    subject: str


async def _email(job: Email, ctx: Any) -> None: ...


async def _anything(job: dict[str, Any], ctx: Any) -> None: ...


HANDLERS = [JobHandler("email.send", _email, Email, 30.0, 1, "key"),
            JobHandler("email.send", _anything, None, 30.0, 1, "key")]
canary_values = st.sampled_from([CANARY, 7, None, True, [CANARY], {"x": CANARY}, 1.5])
canary_payloads = st.dictionaries(st.sampled_from(["to", "subject", "extra"]), canary_values,
                                  max_size=3).map(orjson.dumps)


@FUZZ
@given(raw=st.binary(max_size=64) | big_bytes | json_values.map(orjson.dumps) | canary_payloads,
       handler=st.sampled_from(HANDLERS))
def test_fuzz_the_payload_parser_never_quotes_the_payload(raw: bytes,
                                                          handler: JobHandler) -> None:
    try:
        handler.parse_payload(raw)
    except BadRecord as bad:
        refused: BadRecord | None = bad
    else:
        refused = None
    if refused is not None:
        assert refused.reason in {"bad-json", "invalid-payload"}
        # The dead letter's error header (message and traceback, causes included) may be
        # read by anyone with access to the DLQ: names and rules, never values.
        letter = FailureInfo.from_exception(refused, refused.reason, 0).to_json()
        assert CANARY.encode() not in letter


# -- the worker's path for one record -----------------------------------------------------


@dataclass
class FakeRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Any
    value: Any
    headers: Any


@pytest.fixture
async def worker(tmp_path: Path) -> Any:
    (tmp_path / "email.send.toml").write_text('partitions = 1\nretry_tiers = ["5s"]\n'
                                              "max_attempts = 2\n")
    settings = Settings(topics_dir=tmp_path, topic_prefix="fuzz",
                        kafka_bootstrap="127.0.0.1:9")  # never dialled: writes are captured
    app = App(settings)

    @app.job("email.send", timeout=5)
    async def send(job: dict[str, Any], ctx: Any) -> None:
        if job.get("fail"):
            raise ValueError("the handler failed")

    built = app.worker("email.send", relay=False, control=False)
    assert load_job_types(tmp_path)["email.send"].max_attempts == 2
    return built


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(key=any_value, value=st.one_of(any_value, json_values.map(orjson.dumps),
                                      st.just(b'{"fail": true}')),
       headers=any_headers)
async def test_fuzz_one_record_through_the_worker(worker: Any, key: Any, value: Any,
                                                  headers: Any) -> None:
    """Whatever the record, the worker finishes it with an outcome and never raises."""
    letters: list[str] = []
    writes: list[tuple[str, JobRecord]] = []

    async def dead_letter_raw(record: Any, bad: BadRecord) -> FailureInfo:
        letters.append(bad.reason)
        return FailureInfo.from_exception(bad, bad.reason, 0)

    async def write(topic: str, job: JobRecord) -> None:
        writes.append((topic, job))

    worker.dead_letter_raw = dead_letter_raw
    worker.write = write
    before = sum(worker.outcomes.values())
    record = FakeRecord("fuzz.email.send", 0, 7, 1_700_000_000_000, key, value, headers)
    await asyncio.wait_for(worker.handle(None, record, Runner()), 10)
    after = sum(worker.outcomes.values())
    assert after - before <= 1  # one outcome, or none for a heartbeat
    assert all(reason in DECODE_REASONS for reason in letters)
    for topic, job in writes:
        assert topic in {"fuzz.email.send.dlq", "fuzz.email.send.retry-5s"}
        assert job.failure is not None


# -- nothing unpickles or evaluates ------------------------------------------------------

_FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill",
                      "cloudpickle", "jsonpickle", "yaml"}
_FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def _violations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        found += [f"{path.name}:{node.lineno} imports {m}" for m in modules
                  if m.split(".")[0] in _FORBIDDEN_MODULES]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _FORBIDDEN_CALLS):
            found.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    return found


def test_nothing_in_the_package_unpickles_or_evaluates() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    problems = [v for path in files for v in _violations(path)]
    assert problems == [], "stream_jobs must not deserialise code: " + "; ".join(problems)


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nfrom yaml import load\nx = eval('1')\nre.compile('x')\n")
    assert len(_violations(bad)) == 3
