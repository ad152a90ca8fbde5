"""The CLI's one sentence for a `StreamJobsError`: printed as written, exit code 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_jobs.cli import main


def test_brackets_in_a_message_are_printed_not_read_as_markup(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    (tmp_path / "tick.beat.toml").write_text('[[schedules]]\nevery = "1m"\n')
    monkeypatch.setenv("STREAM_JOBS_TOPICS_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exited:
        main(["stats"])  # the TOML is refused before any I/O
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: "), err
    assert "[[schedules]] number 1 needs a 'name'" in err, err


def test_a_message_quoting_a_secret_is_printed_without_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import stream_jobs.cli as cli
    from stream_jobs.errors import DatabaseUnavailable

    monkeypatch.setenv("STREAM_JOBS_GATEWAY_TOKEN", "token-canary-1")

    def fails(**_: object) -> None:
        raise DatabaseUnavailable("Postgres did not answer at postgresql://u@h/db?"
                                  "password=url-canary-2 with token-canary-1.")

    monkeypatch.setattr(cli, "app", fails)
    with pytest.raises(SystemExit):
        main(["stats"])
    err = capsys.readouterr().err
    assert "password=***" in err, err
    assert "canary" not in err, err
