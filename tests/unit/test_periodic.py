"""[[schedules]] in topics/*.toml and ScheduleSpec: what is read, and every refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_jobs.errors import ConfigError
from stream_jobs.job_types import load_job_types
from stream_jobs.periodic import SCHEDULE_KEYS, ScheduleSpec


def load(tmp_path: Path, text: str) -> tuple[ScheduleSpec, ...]:
    (tmp_path / "digest.send.toml").write_text(text)
    return load_job_types(tmp_path)["digest.send"].schedules


def refusal(tmp_path: Path, text: str) -> str:
    (tmp_path / "digest.send.toml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_job_types(tmp_path)
    return str(caught.value)


def test_the_design_example_is_read(tmp_path: Path) -> None:
    (nightly,) = load(tmp_path, """
partitions = 3
[[schedules]]
name = "nightly"
cron = "0 3 * * *"
timezone = "Europe/Berlin"
payload = {scope = "all"}
missed = "latest"
""")
    assert nightly == ScheduleSpec("nightly", cron="0 3 * * *", timezone="Europe/Berlin",
                                   payload={"scope": "all"}, missed="latest")
    assert nightly.describe() == "cron 0 3 * * * (Europe/Berlin)"


def test_defaults_and_every(tmp_path: Path) -> None:
    tick, slow = load(tmp_path, """
[[schedules]]
name = "tick"
every = "5m"
[[schedules]]
name = "slow"
every = 90
missed = "all"
""")
    assert (tick.every_s, tick.every_ms, tick.timezone, tick.payload, tick.missed) == \
        (300.0, 300_000, "UTC", {}, "latest")
    assert (slow.every_s, slow.missed) == (90.0, "all")
    assert tick.describe() == "every 5m"


def test_a_file_without_schedules_has_none(tmp_path: Path) -> None:
    assert load(tmp_path, "partitions = 2") == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('schedules = "nightly"', "'schedules' must be tables written [[schedules]]"),
        ("[[schedules]]\ncron = \"0 3 * * *\"", "[[schedules]] number 1 needs a 'name' string"),
        ("[[schedules]]\nname = \"a b\"\nevery = \"1m\"", "'name' 'a b' is not a schedule name"),
        ("[[schedules]]\nname = \"n\"", "'cron' of schedule 'n' or 'every' is needed"),
        ("[[schedules]]\nname = \"n\"\ncron = \"* * * * *\"\nevery = \"1m\"",
         "and only one of them"),
        ("[[schedules]]\nname = \"n\"\ncron = \"0 25 * * *\"",
         "'cron' of schedule 'n' '0 25 * * *' is not a cron expression (Bad hour)"),
        ("[[schedules]]\nname = \"n\"\ncron = \"0 3 * *\"", "is not a cron expression"),
        ("[[schedules]]\nname = \"n\"\ncron = \"0 0 3 * * *\"",
         "write five fields: minute hour day month weekday"),
        ("[[schedules]]\nname = \"n\"\ncron = 3", "'cron' of schedule 'n' must be a string"),
        ("[[schedules]]\nname = \"n\"\ncron = \"0 3 * * *\"\ntimezone = \"Mars/Olympus\"",
         "'timezone' of schedule 'n' 'Mars/Olympus' is not a timezone of the tz database"),
        ("[[schedules]]\nname = \"n\"\nevery = \"5m\"\ntimezone = \"Europe/Berlin\"",
         "'timezone' of schedule 'n' applies to cron only"),
        ("[[schedules]]\nname = \"n\"\nevery = \"soon\"", "'every' of schedule 'n': 'soon' is "
         "not a duration"),
        ("[[schedules]]\nname = \"n\"\nevery = \"500ms\"", "must be a whole number of ms, at "
         "least 1s, not 500ms"),
        ("[[schedules]]\nname = \"n\"\nevery = true", "'every' of schedule 'n' must be a "
         "duration"),
        ("[[schedules]]\nname = \"n\"\nevery = \"1m\"\nmissed = \"never\"",
         "'missed' of schedule 'n' is 'never'; choose one of latest, skip, all"),
        ("[[schedules]]\nname = \"n\"\nevery = \"1m\"\npayload = 3",
         "'payload' of schedule 'n' must be a table"),
        ("[[schedules]]\nname = \"n\"\nevry = \"1m\"",
         "schedule 'n' has an unknown key 'evry' (did you mean 'every'?)"),
        ("[[schedules]]\nname = \"n\"\nevery = \"1m\"\n[[schedules]]\nname = \"n\"\n"
         "every = \"2m\"", "schedule 'n' is declared twice"),
    ],
)
def test_each_bad_schedule_names_the_file_the_schedule_and_the_key(
        tmp_path: Path, text: str, expected: str) -> None:
    message = refusal(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'digest.send.toml'}: ")
    assert expected in message
    assert "\n" not in message


def test_the_known_keys_are_listed_for_an_unknown_one(tmp_path: Path) -> None:
    message = refusal(tmp_path, "[[schedules]]\nname = \"n\"\nevery = \"1m\"\ncolour = 1")
    assert "known keys are " + ", ".join(SCHEDULE_KEYS) in message


def test_a_spec_built_in_code_is_validated_too() -> None:
    with pytest.raises(ConfigError, match="'cron' of schedule 'x' or 'every' is needed"):
        ScheduleSpec("x")
    with pytest.raises(ConfigError, match="is not a cron expression"):
        ScheduleSpec("x", cron="every day")
    assert ScheduleSpec("x", every_s=1.5).every_ms == 1500
