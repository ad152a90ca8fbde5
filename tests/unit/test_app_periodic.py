"""`@app.periodic` and the App's schedules: declaration, refusals, and the scheduler a
worker gets (no services: nothing here connects)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import ConfigError, UnknownJobType
from stream_jobs.settings import Settings


class Digest(BaseModel):
    scope: str


def app_with(tmp_path: Path, toml: str = "") -> App:
    (tmp_path / "digest.send.toml").write_text(toml)
    return App(Settings(topics_dir=tmp_path))


NIGHTLY = '[[schedules]]\nname = "nightly"\ncron = "0 3 * * *"\npayload = {scope = "all"}\n'


def test_a_periodic_function_is_a_schedule_of_its_type(tmp_path: Path) -> None:
    app = app_with(tmp_path, NIGHTLY)

    @app.periodic("digest.send", name="hourly", cron="0 * * * *", timezone="Europe/Berlin")
    def hourly(fire_time: datetime) -> dict[str, str]:
        return {"scope": fire_time.isoformat()}

    nightly, in_code = app.schedules("digest.send")
    assert (nightly.name, nightly.in_code) == ("nightly", False)
    assert (in_code.name, in_code.in_code, in_code.timezone) == ("hourly", True, "Europe/Berlin")
    assert in_code.source is not None
    assert in_code.source.endswith("hourly")
    assert app.scheduled_types() == ["digest.send"]
    runner = app.scheduler("digest.send")
    assert runner is not None
    assert runner.payloads == {"hourly": hourly}


def test_every_takes_a_duration_seconds_or_a_timedelta(tmp_path: Path) -> None:
    app = app_with(tmp_path)
    for name, every in (("a", "5m"), ("b", 300), ("c", timedelta(minutes=5))):
        app.periodic("digest.send", name=name, every=every)(lambda fire_time: {})
    assert {s.every_s for s in app.schedules("digest.send")} == {300.0}


def test_bad_declarations_are_refused_when_the_module_loads(tmp_path: Path) -> None:
    app = app_with(tmp_path)
    with pytest.raises(ConfigError, match="'cron' of schedule 'x' '0 25 \\* \\* \\*' is not"):
        app.periodic("digest.send", name="x", cron="0 25 * * *")
    with pytest.raises(ConfigError, match="'every' of schedule 'x': 'often' is not a duration"):
        app.periodic("digest.send", name="x", every="often")
    with pytest.raises(ConfigError, match="is not a job type name"):
        app.periodic("Digest", name="x", every="1m")
    app.periodic("digest.send", name="x", every="1m")(lambda fire_time: {})
    with pytest.raises(ConfigError, match="already has a schedule 'x' declared in code"):
        app.periodic("digest.send", name="x", every="2m")(lambda fire_time: {})


def test_a_name_in_both_toml_and_code_is_refused(tmp_path: Path) -> None:
    app = app_with(tmp_path, NIGHTLY)
    app.periodic("digest.send", name="nightly", every="1h")(lambda fire_time: {})
    with pytest.raises(ConfigError,
                       match=r"declared in .*digest\.send\.toml and by @app\.periodic"):
        app.schedules("digest.send")


def test_a_type_without_schedules_has_no_scheduler(tmp_path: Path) -> None:
    app = app_with(tmp_path)
    assert app.scheduler("digest.send") is None
    assert app.scheduled_types() == []


def test_a_periodic_job_of_an_undeclared_type_says_how_to_declare_it(tmp_path: Path) -> None:
    app = app_with(tmp_path)
    app.periodic("report.build", name="x", every="1m")(lambda fire_time: {})
    with pytest.raises(UnknownJobType, match=r"declare it in topics/report\.build\.toml"):
        app.scheduler("report.build")


def test_a_toml_payload_that_does_not_fit_the_model_is_refused_before_anything_fires(
        tmp_path: Path) -> None:
    app = app_with(tmp_path, '[[schedules]]\nname = "n"\nevery = "1m"\npayload = {scope = 3}\n')

    @app.job("digest.send")
    async def send(job: Digest, ctx: JobContext) -> None: ...

    with pytest.raises(ConfigError, match="the payload of schedule 'n' does not fit Digest: "
                                          "scope: Input should be a valid string"):
        app.scheduler("digest.send")
    with pytest.raises(ConfigError, match="does not fit Digest"):
        app.worker("digest.send")
