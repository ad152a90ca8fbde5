"""Hostile schedules (issue 28): cron expressions, `every`, topics files of 10,000
schedules or nested past any parser's depth. Each is refused with a ConfigError that names
the schedule and the key, or parsed, and then its fire times come in bounded time: a
refusal is asserted, never a clock, except where a list must be read whole.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_jobs.durations import parse_duration
from stream_jobs.errors import ConfigError
from stream_jobs.job_types import load_job_types
from stream_jobs.periodic import MAX_EVERY_S, ScheduleSpec, parse_schedules
from stream_jobs.schedules.timing import COUNT_LIMIT, fire_times, local_time, next_fire_ms

from .test_hostile_surfaces import a_sentence, attempt

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NOW_MS = 1_780_000_000_000  # 2026-05-28
YEAR_MS = 366 * 86_400_000

numbers = st.one_of(st.integers(0, 70), st.sampled_from([0, 99, 10**6, 10**30]))
ranges = st.builds(lambda a, b: f"{a}-{b}", numbers, numbers)
steps = st.builds(lambda base, n: f"{base}/{n}", st.sampled_from(["*", "0-59", "1-31", "5"])
                  | ranges, numbers)
tokens = st.one_of(st.just("*"), numbers.map(str), ranges, steps,
                   st.sampled_from(["L", "LW", "1W", "5L", "1#5", "7#5", "0#0", "?", "MON-FRI",
                                    "JAN", "sun", "-", "/", ",", "**", "\x00", "\ud800", ""]))
fields = st.lists(tokens, min_size=1, max_size=4).map(",".join)
crons = st.one_of(
    st.lists(fields, min_size=5, max_size=5).map(" ".join),
    st.lists(fields, min_size=0, max_size=7).map(" ".join),
    st.text(max_size=30),
    st.sampled_from([
        "*/0 * * * *", "0-59/1 0-23 1-31 1-12 0-6", "0 0 30 2 *", "0 0 31 4 *",
        "0 0 30 2 1#5", "0 0 29 2 1", ",".join(str(i % 60) for i in range(10_000)) + " * * * *",
        "0 0 " + ",".join(["1-31/1"] * 3_000) + " * *", "* * * * * *", "@yearly", "@reboot",
    ]),
)


@FUZZ
@given(cron=crons, timezone=st.sampled_from(["UTC", "Europe/Berlin", "Australia/Lord_Howe",
                                             "Nowhere/Else", "../../etc/passwd", "", "\x00"]))
def test_fuzz_cron_expressions(cron: str, timezone: str) -> None:
    spec, refused = attempt(lambda: ScheduleSpec("fuzz", cron=cron, timezone=timezone),
                            ConfigError)
    if spec is None:
        assert str(refused).startswith(("'cron' of schedule 'fuzz'",
                                        "'timezone' of schedule 'fuzz'"))
        return
    first = next_fire_ms(spec, NOW_MS)
    assert first is None or first > NOW_MS
    found, total = fire_times(spec, NOW_MS - YEAR_MS, NOW_MS, newest=3)
    assert len(found) <= 3
    assert total <= COUNT_LIMIT
    assert all(NOW_MS - YEAR_MS < fire <= NOW_MS for fire in found)
    assert found == sorted(found)


@pytest.mark.parametrize("cron", ["*/0 * * * *", "0 0 30 2 *", "61 * * * *", "* * * *",
                                  "0 0 1 13 *", "0 25 * * *", "0 0 * * 8"])
def test_a_cron_that_can_never_fire_or_divides_by_zero_is_refused(cron: str) -> None:
    with pytest.raises(ConfigError, match="write five fields"):
        ScheduleSpec("nightly", cron=cron)


def test_a_cron_of_huge_lists_answers_like_its_short_spelling() -> None:
    listed = ScheduleSpec("a", cron=",".join(str(i % 60) for i in range(10_000)) + " * * * *")
    ranged = ScheduleSpec("b", cron="0-59/1 0-23 1-31 1-12 0-6")
    every = ScheduleSpec("c", cron="* * * * *")
    answers = {next_fire_ms(spec, NOW_MS) for spec in (listed, ranged, every)}
    assert answers == {NOW_MS // 60_000 * 60_000 + 60_000}


everies = st.one_of(
    st.floats(), st.integers(-10, 10**30), st.sampled_from([10**400, 2**63, 0.0005]),
    st.text(max_size=12), st.booleans(), st.none(), st.lists(st.integers(), max_size=2),
    st.sampled_from(["5m", "1e400s", "99999999999999999999999d", "nan", "inf", "500ms",
                     "3650d", "3651d", "1.0005s"]),
)


@FUZZ
@given(everies)
def test_fuzz_every(raw: Any) -> None:
    specs, refused = attempt(lambda: parse_schedules([{"name": "fuzz", "every": raw}]),
                             ConfigError)
    if specs is None:
        assert str(refused).startswith("'every' of schedule 'fuzz'"), refused
        return
    [spec] = specs
    assert spec.every_s is not None
    assert 1 <= spec.every_s <= MAX_EVERY_S
    fire = next_fire_ms(spec, NOW_MS)
    assert fire is not None
    local_time(spec, fire)  # a date a page can show


@pytest.mark.parametrize("raw", [float("inf"), float("nan"), 1e308, 10**400,
                                 "99999999999999999999999d"])
def test_an_every_no_clock_can_reach_is_refused_with_a_sentence(raw: Any) -> None:
    # inf and 1e308 used to raise OverflowError, nan ValueError; the huge spellings were
    # taken, and their first firing, in the year 10**20, broke every page that showed it.
    with pytest.raises(ConfigError, match=r"^'every' of schedule 'nightly'"):
        parse_schedules([{"name": "nightly", "every": raw}])


@FUZZ
@given(st.one_of(st.floats(), st.integers(), st.text(max_size=12), st.sampled_from(
    [10**400, "1e400s", "9" * 400 + "d", "nan", "-0s", "0.5ms"])))
def test_fuzz_durations(raw: Any) -> None:
    seconds, refused = attempt(lambda: parse_duration(raw), ConfigError)
    if seconds is None:
        a_sentence(refused)
        return
    assert 0 <= seconds < float("inf")


def test_ten_thousand_schedules_are_read_in_linear_time() -> None:
    # The check for a repeated name compared each schedule with every one before it: 10,000
    # took 1.9 s here, 100,000 would take minutes. A list must be read whole, so the bound
    # is on time, and generous (a tenth of a second is usual).
    tables = [{"name": f"s{i}", "every": "5m"} for i in range(10_000)]
    started = time.perf_counter()
    specs = parse_schedules(tables)
    assert len(specs) == 10_000
    assert time.perf_counter() - started < 1.5
    with pytest.raises(ConfigError, match="schedule 's0' is declared twice"):
        parse_schedules([*tables, {"name": "s0", "every": "1m"}])


@pytest.mark.parametrize("nested", [
    "payload = " + "{a = " * 5_000 + "1" + "}" * 5_000,
    "payload = {a = " + "[" * 5_000 + "1" + "]" * 5_000 + "}",
])
def test_a_topics_file_nested_too_deeply_is_a_config_error(tmp_path: Path, nested: str
                                                           ) -> None:
    # tomllib recurses per level: this used to escape as a bare RecursionError.
    path = tmp_path / "digest.send.toml"
    path.write_text(f'partitions = 1\n[[schedules]]\nname = "n"\nevery = "5m"\n{nested}\n')
    with pytest.raises(ConfigError) as refused:
        load_job_types(tmp_path)
    assert str(refused.value) == (f"{path}: its arrays or inline tables are nested too "
                                  "deeply to read; flatten them.")


@pytest.mark.parametrize(("text", "said"), [
    (b'partitions = 1\n# \xff\n', "not valid TOML"),
    ('partitions = 1\nschedules = 5\n', "'schedules' must be tables"),
    ('partitions = 1\n[[schedules]]\nname = "n"\ncron = "0 3 * * *"\ntimezone = "\\u0000"\n',
     "is not a timezone"),
    ('partitions = 1\n[[schedules]]\nname = "n"\nevery = "5m"\nmissed = ["all"]\n',
     "'missed' of schedule 'n' must be a string"),
])
def test_hostile_topics_files_name_the_file_and_the_key(tmp_path: Path, text: str | bytes,
                                                       said: str) -> None:
    path = tmp_path / "digest.send.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=said) as refused:
        load_job_types(tmp_path)
    assert str(refused.value).startswith(f"{path}: ")


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("payload", "why"), [
    ({"n": 2**70}, "Integer exceeds 64-bit range"),
    ({"a": _nested(300)}, "Recursion limit reached"),
])
def test_a_payload_json_cannot_hold_is_refused_when_the_file_is_loaded(
        payload: dict[str, object], why: str) -> None:
    # For a type without a model it used to be found at every firing: a warning, a retry,
    # and the firing counted missed, for ever.
    with pytest.raises(ConfigError) as refused:
        parse_schedules([{"name": "nightly", "every": "1h", "payload": payload}])
    assert str(refused.value) == (f"'payload' of schedule 'nightly' cannot be written as "
                                  f"JSON ({why}).")
