"""Log lines with fields: what the text and JSON formats write, and configure(), which
also sets the Kafka driver's level (`STREAM_JOBS_KAFKA_LOG_LEVEL`)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs import logs
from stream_jobs.errors import ConfigError
from stream_jobs.job_ids import control_character
from stream_jobs.logs import JsonFormatter, TextFormatter, job_fields
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings, load_settings

from .fake_records import FakeRecord

JOB = JobRecord(job_id="j-1", job_type="mail.send", payload=b'{"secret": 1}', key=None,
                attempt=2)


def line(message: str, *args: object, exc: BaseException | None = None,
         **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("stream_jobs.worker", logging.WARNING, __file__, 1, message,
                               args, None if exc is None else (type(exc), exc, None))
    record.__dict__.update(extra)
    return record


def test_job_fields_name_the_job_and_where_it_was_read() -> None:
    fields = job_fields(JOB, FakeRecord("jobs.mail.send", 3, 41), reason="timeout")
    assert fields == {"job_type": "mail.send", "job_id": "j-1", "attempt": 2,
                      "topic": "jobs.mail.send", "partition": 3, "offset": 41,
                      "reason": "timeout"}
    assert job_fields(None, FakeRecord("t", 0, 7)) == {"topic": "t", "partition": 0,
                                                        "offset": 7}


def test_a_line_about_a_traced_job_carries_its_trace_id() -> None:
    traced = JOB.with_(traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    fields = job_fields(traced, FakeRecord("t", 0, 7))
    assert fields["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    text = TextFormatter().format(line("job j-1 retried", **fields))
    assert "trace_id=0af7651916cd43dd8448eb211c80319c" in text
    # No trace context, or one that is not W3C's: no field (never an error).
    assert "trace_id" not in job_fields(JOB, FakeRecord("t", 0, 7))
    assert job_fields(JOB.with_(traceparent="00-x"))["trace_id"] is None


def test_json_lines_carry_the_fields_as_keys() -> None:
    record = line("job %s dead-lettered", "j-1", **job_fields(JOB, FakeRecord("t", 1, 5)))
    written = orjson.loads(JsonFormatter().format(record))
    assert written["message"] == "job j-1 dead-lettered"
    assert (written["level"], written["logger"]) == ("WARNING", "stream_jobs.worker")
    assert {k: written[k] for k in logs.JOB_FIELDS} == {
        "job_type": "mail.send", "job_id": "j-1", "attempt": 2, "topic": "t",
        "partition": 1, "offset": 5}
    assert written["time"].endswith("+00:00")
    assert "payload" not in written  # only identities and positions travel


def test_json_lines_carry_the_error_class_and_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        record = line("failed", exc=exc)
    written = orjson.loads(JsonFormatter().format(record))
    assert written["error"] == "RuntimeError"
    assert "RuntimeError: boom" in written["traceback"]


def test_text_lines_append_the_fields() -> None:
    record = line("commit failed", group="jobs.mail.worker",
                  partitions=["jobs.mail/0", "jobs.mail/1"], reason="needs quoting here")
    text = TextFormatter().format(record)
    assert text.endswith("commit failed group=jobs.mail.worker reason=\"needs quoting here\" "
                         "partitions=jobs.mail/0,jobs.mail/1")
    assert TextFormatter().format(line("plain")).endswith("stream_jobs.worker plain")


def written(log_format: logs.LogFormat, emit: Callable[[], None]) -> list[str]:
    """The lines `emit()` writes once `configure(log_format=..., level="info")` ran."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    out = io.StringIO()
    try:
        logs.configure(log_format=log_format, level="info", stream=out)
        emit()
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    return out.getvalue().splitlines()


def test_configure_writes_the_chosen_format() -> None:
    def emit() -> None:
        logging.getLogger("stream_jobs.test").info("hello", extra={"job_id": "j-9"})
        logging.getLogger("stream_jobs.test").debug("below the level")

    [line] = written("json", emit)
    assert orjson.loads(line)["job_id"] == "j-9"


def configured(**options: object) -> list[str]:
    """The lines the Kafka driver's logger writes at each level once `configure(**options)`
    ran (and the root logger as it was afterwards)."""
    root, driver = logging.getLogger(), logging.getLogger("aiokafka")
    saved = root.handlers[:], root.level, driver.level, driver.propagate
    out = io.StringIO()
    try:
        logs.configure(stream=out, **options)  # type: ignore[arg-type]
        for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
            driver.log(level, "driver line at %s", logging.getLevelName(level))
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        driver.setLevel(saved[2])
        driver.propagate = saved[3]
    return [line.rpartition(" at ")[2] for line in out.getvalue().splitlines()]


def test_the_kafka_drivers_info_lines_are_left_out_by_default() -> None:
    # Its INFO lines repeat a group's partitions at every rebalance, 1-2 KB each.
    assert configured(level="DEBUG") == ["WARNING", "ERROR"]
    assert configured(level="DEBUG", kafka_level="info") == ["INFO", "WARNING", "ERROR"]
    # --log-level is the floor for every line, the driver's too.
    assert configured(level="ERROR", kafka_level="DEBUG") == ["ERROR"]
    assert configured(level="INFO", kafka_level="DEBUG") == ["INFO", "WARNING", "ERROR"]


def test_the_kafka_log_level_is_a_setting_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().kafka_log_level == "WARNING"
    monkeypatch.setenv("STREAM_JOBS_KAFKA_LOG_LEVEL", " info ")
    assert Settings().kafka_log_level == "INFO"
    monkeypatch.setenv("STREAM_JOBS_KAFKA_LOG_LEVEL", "chatty")
    with pytest.raises(ConfigError, match="STREAM_JOBS_KAFKA_LOG_LEVEL: Input should be"):
        load_settings()


# -- lines that cannot be forged ---------------------------------------------------------

FORGED = "abc\n2030-01-01 00:00:00,000 CRITICAL stream_jobs.worker forged"


def _raised(message: str) -> BaseException:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return exc


def test_a_job_id_with_a_newline_stays_on_its_line() -> None:
    record = line("job %s failed", FORGED, job_id=FORGED, reason="a\rb\x1b[2Kc\u2028d")
    text = TextFormatter().format(record)
    assert text.splitlines() == [text]
    assert "job abc\\n2030-01-01" in text
    assert 'reason=a\\rb\\x1b[2Kc\\u2028d' in text
    assert text.count("job_id=") == 1


def test_a_traceback_is_indented_down_to_the_exceptions_message() -> None:
    exc = _raised(f"boom\n{FORGED}")
    record = line("failed")
    record.exc_info = (type(exc), exc, exc.__traceback__)
    first, *rest = TextFormatter().format(record).splitlines()
    assert first.endswith("stream_jobs.worker failed")
    assert rest[0] == "    Traceback (most recent call last):"
    assert rest[-3:] == ["    RuntimeError: boom", "    abc",
                         "    2030-01-01 00:00:00,000 CRITICAL stream_jobs.worker forged"]
    assert all(line.startswith("    ") for line in rest)


def test_a_quote_in_a_field_value_cannot_end_it() -> None:
    text = TextFormatter().format(line("x", job_id='a" reason="forged'))
    assert text.endswith('job_id="a\\" reason=\\"forged"')


def test_a_json_line_stays_one_line_whatever_its_strings_hold() -> None:
    record = line("m\u2028n\x85o\ud800", job_id=FORGED, exc=_raised("p\u2029q\nr"))
    written = JsonFormatter().format(record)
    assert written.splitlines() == [written]
    parsed = json.loads(written)  # a lone surrogate: orjson refuses it, json escapes it
    assert parsed["message"] == "m\u2028n\x85o\ud800"
    assert parsed["job_id"] == FORGED
    assert parsed["traceback"].endswith("RuntimeError: p\u2029q\nr")


def test_other_loggers_go_through_the_same_formatter() -> None:
    [line] = written("text", lambda: logging.getLogger("some.app").warning("user said %s",
                                                                           FORGED))
    assert "some.app user said abc\\n2030" in line


_ANY = st.text(max_size=40)
_FIELD_VALUES = st.one_of(_ANY, st.integers(), st.lists(_ANY, max_size=3))


@given(message=_ANY, values=st.dictionaries(st.sampled_from(logs.FIELDS), _FIELD_VALUES,
                                            max_size=4),
       error=st.none() | _ANY, logger=_ANY.filter(bool))
def test_no_text_line_can_start_a_record_of_its_own(message: str, values: dict[str, object],
                                                    error: str | None, logger: str) -> None:
    record = line("%s", message, exc=None if error is None else _raised(error), **values)
    record.name = logger
    first, *rest = TextFormatter().format(record).splitlines()
    assert control_character(first) is None
    assert all(line[:1].isspace() for line in rest), rest


@given(message=_ANY, values=st.dictionaries(st.sampled_from(logs.FIELDS), _FIELD_VALUES,
                                            max_size=4),
       error=st.none() | _ANY)
def test_a_json_line_is_one_line_that_reads_back(message: str, values: dict[str, object],
                                                error: str | None) -> None:
    record = line("%s", message, exc=None if error is None else _raised(error), **values)
    written = JsonFormatter().format(record)
    assert written.splitlines() == [written]
    parsed = json.loads(written)
    assert parsed["message"] == message
    if error is not None:
        assert parsed["error"] == "RuntimeError"
        assert error.rstrip("\n") in parsed["traceback"]
