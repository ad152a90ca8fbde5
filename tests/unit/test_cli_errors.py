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


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--job-id", "orders/42", "A --job-id cannot contain '/'"),
    ("--job-id", "abc\nCRITICAL forged", "A --job-id cannot contain the control character"),
    ("--key", "k\x1b[2J", "A --key cannot contain the control character U+001B"),
])
def test_enqueue_refuses_an_id_or_key_before_connecting(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        flag: str, value: str, says: str) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("STREAM_JOBS_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never dialled
    with pytest.raises(SystemExit) as exited:
        main(["enqueue", "any.type", "{}", flag, value])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert says in err, err
