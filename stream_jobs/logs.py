"""Logs a person can search: fields on every line about a job, text or JSON.

stream-jobs logs through the standard library's `logging`, under logger names
`stream_jobs.*`, so an application's own logging configuration applies to it as it is.
A line about a job carries `job_type`, `job_id`, `attempt`, `topic`, `partition`,
`offset` and, when the job has a trace, `trace_id` as fields of the log record
(`extra=job_fields(...)`); a line about a partition (a rebalance, a commit) carries the
ones it has. `STREAM_JOBS_LOG_FORMAT=json`
(or `configure(format="json")`) writes one JSON object per line with those fields as
keys; the default text format appends them as `key=value`. No line carries payload
bytes or a setting's secret: fields are identities and positions only.

Neither format lets what it writes forge or break a line, whoever wrote the message or
chose the job ID: a text line's first physical line holds no control character (message,
logger and field values escaped: a newline as `\\n`, others as `\\xNN` or `\\uNNNN`), and
each further line of it (a traceback, the exception's message included) starts with
whitespace; a JSON line is one object on one line, whatever its strings hold.

Why stdlib logging and not structlog: stream-jobs runs inside applications that already
configure `logging`; records with `extra` fields work with their handlers unchanged, and
the JSON formatter is this module, not a dependency.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from stream_jobs.job_ids import CONTROL_CHARACTERS
from stream_jobs.record import JobRecord, Record, trace_id_of

LogFormat = Literal["text", "json"]
# The fields of a line about a job, in the order text lines show them.
JOB_FIELDS = ("job_type", "job_id", "attempt", "topic", "partition", "offset")
# Other fields our lines may carry (a job's trace, a group, a worker, a reason code, a
# duration).
OTHER_FIELDS = ("trace_id", "group", "worker_id", "reason", "outcome", "tier", "timeout_s",
                "blocked_s", "child", "partitions")
FIELDS = (*JOB_FIELDS, *OTHER_FIELDS)


def job_fields(job: JobRecord | None, record: Record | None = None, **more: Any
               ) -> dict[str, Any]:
    """The `extra=` of a line about `job`, read from `record` (where it was consumed)."""
    fields: dict[str, Any] = {}
    if job is not None:
        fields.update(job_type=job.job_type, job_id=job.job_id, attempt=job.attempt)
        if job.traceparent is not None:  # the job's trace (docs/tracing.md), if it has one
            fields["trace_id"] = trace_id_of(job.traceparent)
    if record is not None:
        fields.update(topic=record.topic, partition=record.partition, offset=record.offset)
    fields.update(more)
    return fields


def _fields_of(record: logging.LogRecord) -> dict[str, Any]:
    found = record.__dict__
    return {name: found[name] for name in FIELDS if found.get(name) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, our fields, and the error
    (its class and the traceback) when the line has one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields_of(record),
        }
        if record.processName and record.processName != "MainProcess":
            line["process"] = record.processName
        if record.exc_info:
            line["error"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            line["traceback"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        try:
            written = orjson.dumps(line, default=str).decode()
        except TypeError:  # a lone surrogate, which orjson refuses: the standard library's
            written = json.dumps(line, default=str, ensure_ascii=True)
        # JSON leaves these raw inside strings; str.splitlines() and some viewers break
        # lines at them.
        return _JSON_BREAKS.sub(lambda found: f"\\u{ord(found.group()):04x}", written)


class TextFormatter(logging.Formatter):
    """`time level logger message key=value ...`, the fields after the message (the
    process's name first, in a child of a supervisor)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        more = [part for part in (record.exc_text,
                                  record.stack_info and self.formatStack(record.stack_info))
                if part]
        # Indented, so no line of a traceback (the exception's message is its last) can
        # pass for a line of its own; split as str.splitlines() splits, so no break is left.
        return text + "".join(f"\n    {escape(line)}" for part in more
                              for line in part.splitlines())

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = escape(super().formatMessage(record))
        fields = _fields_of(record)
        if record.processName and record.processName != "MainProcess":
            # A child of `worker --processes N` names itself (worker-2) first.
            fields = {"process": record.processName, **fields}
        if not fields:
            return text
        return text + " " + " ".join(f"{k}={_text(v)}" for k, v in fields.items())


def escape(text: str) -> str:
    """`text` with every control character (`stream_jobs.job_ids.CONTROL_CHARACTERS`)
    written as an escape: `\\n`, `\\r`, `\\t`, `\\xNN`, `\\uNNNN`."""
    return CONTROL_CHARACTERS.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    char = found.group()
    return _SHORT.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100
                                else f"\\u{ord(char):04x}")


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_JSON_BREAKS = re.compile("[\x85\u2028\u2029]")


def _text(value: object) -> str:
    shown = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    shown = escape(shown)
    if shown and " " not in shown and '"' not in shown:
        return shown
    return '"' + shown.replace('"', '\\"') + '"'  # a quote inside cannot end the value


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()


# The Kafka driver's logger, and the level its lines start at unless told otherwise: its
# INFO lines repeat a group's partitions several times at each rebalance.
KAFKA_LOGGER = "aiokafka"
KAFKA_LEVEL = "WARNING"


def configure(*, log_format: LogFormat = "text", level: str | int = "INFO",
              kafka_level: str | int = KAFKA_LEVEL, stream: Any = None) -> None:
    """Send every log line to stderr (or `stream`) in `log_format`, from `level` up,
    replacing the root logger's handlers; the Kafka driver's (aiokafka's) lines from
    `kafka_level` or `level` up, whichever is higher (`STREAM_JOBS_KAFKA_LOG_LEVEL`).
    The worker command calls this."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_number(level))
    driver = logging.getLogger(KAFKA_LOGGER)
    # A logger's own level decides for its lines; the root's does not filter them again.
    driver.setLevel(max(_number(level), _number(kafka_level)))
    driver.propagate = True  # the CLI keeps it quiet until a command configures logging


def _number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    found = logging.getLevelNamesMapping().get(level.strip().upper())
    if found is None:
        raise ValueError(f"{level!r} is not a log level")
    return found


def fields(record: logging.LogRecord) -> Mapping[str, Any]:
    """Our fields on a log record (for tests and custom handlers)."""
    return _fields_of(record)


__all__ = ["FIELDS", "JOB_FIELDS", "KAFKA_LEVEL", "KAFKA_LOGGER", "JsonFormatter", "LogFormat",
           "TextFormatter", "configure", "escape", "fields", "formatter", "job_fields"]
