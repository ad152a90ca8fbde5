"""Log lines with fields: what the text and JSON formats write, and configure(), which
also sets the Kafka driver's level (`STREAM_JOBS_KAFKA_LOG_LEVEL`)."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from stream_jobs import logs
from stream_jobs.errors import ConfigError
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


def test_configure_writes_the_chosen_format() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    out = io.StringIO()
    try:
        logs.configure(log_format="json", level="info", stream=out)
        logging.getLogger("stream_jobs.test").info("hello", extra={"job_id": "j-9"})
        logging.getLogger("stream_jobs.test").debug("below the level")
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    [written] = out.getvalue().splitlines()
    assert orjson.loads(written)["job_id"] == "j-9"


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
