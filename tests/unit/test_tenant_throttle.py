"""`stream-jobs throttle TYPE --tenant X RATE` refuses a bad tenant, a bad rate, a type
without [fairness] and contradictory flags with one sentence, before any I/O."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_jobs.cli import main


@pytest.mark.parametrize(("args", "says"), [
    (["--tenant", "x" * 129, "5/s"], "A tenant is at most 128 bytes of UTF-8; this one is 129."),
    (["--tenant", "a\x1b[2Jb", "5/s"], "A tenant cannot contain the control character U+001B"),
    (["--tenant", "", "5/s"], "A tenant cannot be empty"),
    (["--tenant", "acme", "5/q"], "'5/q' is not a rate: write e.g. 50/s or 600/m"),
    (["--tenant", "acme", "0/s"], "is not a rate"),
    (["--tenant", "acme", "5/s", "--reset"], "Give a RATE or --reset, not both."),
    (["--tenants", "--tenant", "acme"], "--tenants shows the tenants' limits"),
])
def test_throttle_refuses_a_bad_tenant_or_rate_before_connecting(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        args: list[str], says: str) -> None:
    (tmp_path / "mail.send.toml").write_text("[fairness]\ntenant_concurrency = 10\n")
    monkeypatch.setenv("STREAM_JOBS_TOPICS_DIR", str(tmp_path))
    monkeypatch.setenv("STREAM_JOBS_DATABASE_URL", "postgresql://u@127.0.0.1:1/db")  # never dialled
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exited:
        main(["throttle", "mail.send", *args])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert says in err, err


def test_throttle_names_the_missing_fairness_table(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    (tmp_path / "plain.toml").write_text("partitions = 1\n")
    monkeypatch.setenv("STREAM_JOBS_TOPICS_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exited:
        main(["throttle", "plain", "--tenant", "acme", "5/s"])
    assert exited.value.code == 1
    assert "plain has no [fairness] table in its TOML" in capsys.readouterr().err
