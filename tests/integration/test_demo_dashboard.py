"""The dashboard on a demo run (`make demo-serve`: `stream-jobs serve` with the settings
the demo wrote to .stack/demo.env) shows the demo's types with the tiers it applied, and
no "Not applied yet" line: the gateway reads the folder the demo declared them in."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

from consumers import demo as demo_module
from stream_jobs.cli.demo import demo_types, env_file, run_settings, write_env
from stream_jobs.gateway import create_app
from stream_jobs.kafka.topics import apply
from stream_jobs.settings import Settings, load_settings
from tests.waiting import until

from .test_gateway import served

REPO = Path(__file__).resolve().parents[2]


async def test_the_dashboard_of_a_demo_run_shows_the_tiers_it_has(
        settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    run = run_settings(settings.model_copy(update={"stack_dir": tmp_path}),
                       f"{uuid.uuid4().int % 10**14:014d}")
    await apply(run, demo_types(run, demo_module.app))
    write_env(run)
    for line in env_file(run).read_text().splitlines():
        name, value = line.removeprefix("export ").split("=", 1)
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("STREAM_JOBS_KAFKA_BOOTSTRAP", settings.kafka_bootstrap)
    monkeypatch.setenv("STREAM_JOBS_DATABASE_URL", settings.database_url)
    assert os.environ["STREAM_JOBS_TOPIC_PREFIX"] == run.topic_prefix
    gateway = load_settings(gateway_sample_interval_s=0.5)
    async with served(create_app(gateway, require_token=False)) as http:
        async def sampled() -> bool:
            return 'data-type="search.index"' in (await http.get("/")).text

        await until(sampled, "the overview's first sample", within_s=30)
        page = (await http.get("/")).text
    assert "Not applied yet" not in page
    for name in ("email.send", "image.resize", "search.index"):
        card = page.split(f'data-type="{name}"', 1)[1].split("</section>", 1)[0]
        tiers = re.findall(r"<tr><td>(\w+)</td><td class=\"num\">", card.split(
            "delay tier", 1)[1])
        assert tiers == ["1s", "2s", "3s"], (name, tiers)
