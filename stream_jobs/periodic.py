"""Periodic jobs as declared: a schedule's name, its timing, payload and missed policy. Pure.

Declared per type in `topics/T.toml`, one `[[schedules]]` table each:

    [[schedules]]
    name = "nightly"
    cron = "0 3 * * *"          # or: every = "5m"
    timezone = "Europe/Berlin"  # cron only; default "UTC"
    payload = {scope = "all"}   # default {}
    missed = "latest"           # latest | skip | all

or in code with `@app.periodic(...)` (the payload is then computed at fire time). A
`ScheduleSpec` validates itself on construction, so both ways refuse the same mistakes
with one sentence naming the key. When each firing happens is `stream_jobs.schedules`'
business; this module only says what was declared.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from stream_jobs.durations import format_duration, parse_duration
from stream_jobs.errors import ConfigError, PayloadError
from stream_jobs.payloads import encode_payload

MissedPolicy = Literal["latest", "skip", "all"]
MISSED_POLICIES: tuple[str, ...] = get_args(MissedPolicy)
SCHEDULE_KEYS = ("name", "cron", "every", "timezone", "payload", "missed")
# Fire times are whole milliseconds; below a second a schedule is a busy loop, not a job.
MIN_EVERY_S = 1.0
# Past this the next fire time is a date no clock or page can show; a year is cron's.
MAX_EVERY_S = 3650 * 86_400.0
MAX_NAME_CHARS = 100
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule of a job type: exactly one of `cron` (five fields, read in `timezone`)
    or `every_s` (elapsed seconds, counted from the Unix epoch). Raises ConfigError naming
    the key on a bad value."""

    name: str
    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"
    # Left out of the hash (a dict has none); still compared.
    payload: Mapping[str, Any] = field(default_factory=dict, hash=False)
    missed: MissedPolicy = "latest"
    # True for `@app.periodic`: the payload comes from a function called at fire time.
    in_code: bool = False
    # Where it was declared, for messages; not part of the schedule itself.
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name) \
                or len(self.name) > MAX_NAME_CHARS:
            raise ConfigError(
                f"'name' {self.name!r} is not a schedule name: use up to {MAX_NAME_CHARS} "
                "letters, digits, '.', '_' and '-', starting with a letter or digit.")
        if (self.cron is None) == (self.every_s is None):
            raise self._invalid("cron", "or 'every' is needed, and only one of them "
                                "(e.g. cron = \"0 3 * * *\" or every = \"5m\")")
        if self.missed not in MISSED_POLICIES:
            raise self._invalid("missed", f"is {self.missed!r}; choose one of "
                                f"{', '.join(MISSED_POLICIES)}")
        if not isinstance(self.payload, Mapping):
            raise self._invalid("payload", f"must be a table such as {{scope = \"all\"}}, "
                                f"not {self.payload!r}")
        try:  # found now, not at every firing: an integer past 64 bits, nesting past 255
            encode_payload(dict(self.payload))
        except PayloadError as exc:
            why = exc.__cause__ or exc  # orjson's words: "Integer exceeds 64-bit range"
            raise self._invalid("payload", f"cannot be written as JSON ({why})") from None
        if self.every_s is not None:
            if self.timezone != "UTC":
                raise self._invalid("timezone", "applies to cron only: 'every' counts "
                                    "elapsed time from the Unix epoch, whatever the zone")
            if self.every_s > MAX_EVERY_S:
                raise self._invalid("every", f"is at most {format_duration(MAX_EVERY_S)}; a "
                                    "rarer firing is a cron expression's (e.g. \"0 0 1 1 *\")")
            if not self.every_s >= MIN_EVERY_S or \
                    abs(round(self.every_s * 1000) - self.every_s * 1000) > 1e-6:
                raise self._invalid("every", f"must be a whole number of ms, at least "
                                    f"{format_duration(MIN_EVERY_S)}, not "
                                    f"{format_duration(self.every_s)}")
            return
        zone = self.zone
        assert self.cron is not None
        try:
            if not isinstance(self.cron, str) or len(self.cron.split()) != 5:
                # cronsim also takes a seconds field, but then drops Debian cron's DST
                # handling; sub-minute schedules are what `every` is for.
                raise CronSimError("it needs exactly five fields")
            CronSim(self.cron, datetime.now(UTC).astimezone(zone))
        except (CronSimError, TypeError) as exc:
            raise self._invalid("cron", f"{self.cron!r} is not a cron expression ({exc}); "
                                "write five fields: minute hour day month weekday, "
                                "e.g. \"0 3 * * *\"") from None

    @property
    def zone(self) -> ZoneInfo:
        """The schedule's timezone (ConfigError when the name is not in the tz database)."""
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise self._invalid("timezone", f"{self.timezone!r} is not a timezone of the "
                                "tz database; write e.g. \"Europe/Berlin\" or \"UTC\"") from None

    @property
    def every_ms(self) -> int | None:
        return None if self.every_s is None else round(self.every_s * 1000)

    def describe(self) -> str:
        """How it fires, as a person reads it: "cron 0 3 * * * (Europe/Berlin)", "every 5m"."""
        if self.every_s is not None:
            return f"every {format_duration(self.every_s)}"
        return f"cron {self.cron} ({self.timezone})"

    def _invalid(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{key!r} of schedule {self.name!r} {problem}.")


def parse_schedules(raw: object) -> tuple[ScheduleSpec, ...]:
    """The `schedules` key of a topics file (an array of tables) as specs, names unique.

    Raises ConfigError naming the schedule and key; the caller adds the file.
    """
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise ConfigError("'schedules' must be tables written [[schedules]] with a name and "
                          "a cron or every key.")
    specs: list[ScheduleSpec] = []
    names: set[str] = set()  # a set: a file of 10,000 schedules is read in linear time
    for index, table in enumerate(raw, start=1):
        spec = _one_schedule(index, table)
        if spec.name in names:
            raise ConfigError(f"schedule {spec.name!r} is declared twice; give each "
                              "[[schedules]] its own name.")
        names.add(spec.name)
        specs.append(spec)
    return tuple(specs)


def _one_schedule(index: int, table: Mapping[str, object]) -> ScheduleSpec:
    name = table.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"[[schedules]] number {index} needs a 'name' string, e.g. "
                          "name = \"nightly\".")
    for key in table:
        if key not in SCHEDULE_KEYS:
            close = difflib.get_close_matches(key, SCHEDULE_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"schedule {name!r} has an unknown key {key!r}{hint}; "
                              f"known keys are {', '.join(SCHEDULE_KEYS)}.")
    values: dict[str, Any] = {"name": name}
    for key in ("cron", "timezone", "missed"):
        if key in table:
            if not isinstance(table[key], str):
                raise ConfigError(f"{key!r} of schedule {name!r} must be a string, not "
                                  f"{table[key]!r}.")
            values[key] = table[key]
    if "every" in table:
        values["every_s"] = every_seconds(name, table["every"])
    if "payload" in table:
        values["payload"] = table["payload"]
    return ScheduleSpec(**values)


def every_seconds(name: str, raw: object) -> float:
    """An `every` value ("5m", "1h", 30) in seconds; ConfigError naming the schedule."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ConfigError(f"'every' of schedule {name!r} must be a duration such as \"5m\", "
                          f"not {raw!r}.")
    try:
        return parse_duration(raw)
    except ConfigError as exc:
        raise ConfigError(f"'every' of schedule {name!r}: {exc}") from exc
