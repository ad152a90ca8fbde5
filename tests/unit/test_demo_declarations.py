"""The dashboard of a demo run shows the types and tiers the run really had: `stream-jobs
demo` applies its types as consumers/demo_topics/ declares them (not topics/'s, changed in
memory) and writes the run's prefix, schema and that folder to .stack/demo.env, which
`make demo-serve` exports before `stream-jobs serve`. So the topics the gateway expects
are the ones the demo made, and no "Not applied yet" line shows on its overview."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from consumers import demo as demo_module
from stream_jobs.cli.demo import demo_types, env_file, run_settings, write_env
from stream_jobs.job_types import load_job_types
from stream_jobs.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]


def _served_settings(env: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings `stream-jobs serve` reads after `. .stack/demo.env`."""
    for line in env.read_text().splitlines():
        name, value = line.removeprefix("export ").split("=", 1)
        monkeypatch.setenv(name, value)
    return load_settings()


def test_serve_on_demo_env_loads_the_types_the_demo_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    run = run_settings(Settings(stack_dir=tmp_path), "20261206120000")
    write_env(run)
    served = _served_settings(env_file(run), monkeypatch)
    assert (served.topic_prefix, served.database_schema) == ("demo-20261206120000",
                                                           "demo_20261206120000")
    applied = demo_types(run, demo_module.app)
    loaded = load_job_types(served.topics_dir)
    assert sorted(applied) == ["email.send", "image.resize", "search.index"]
    for name, policy in applied.items():
        made = [t.name for t in policy.all_topics(run.topic_prefix)]
        expected = [t.name for t in loaded[name].all_topics(served.topic_prefix)]
        assert made == expected, name
        assert loaded[name].retry_tiers == ("1s", "2s", "3s")
        assert f"demo-20261206120000.{name}.retry-1s" in made


def test_the_demo_declares_topics_types_with_only_its_tiers_changed() -> None:
    # Lanes, partitions, limits: topics/'s, so the demo runs the types the tour declares.
    real = load_job_types(REPO / "topics")
    demo = load_job_types(REPO / "consumers" / "demo_topics")
    assert sorted(demo) == sorted(real)
    for name, policy in demo.items():
        assert (policy.retry_tiers, policy.max_attempts) == (("1s", "2s", "3s"), 4)
        same = replace(policy, retry_tiers=real[name].retry_tiers,
                       max_attempts=real[name].max_attempts, source=real[name].source)
        assert same == real[name], name
