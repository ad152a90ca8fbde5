"""The history process of the local stack: `stream-jobs history` for one topic prefix, run
in the background.

`stream-jobs dev up` starts one for the settings' prefix and schema once Kafka answers and
Postgres is migrated, and `dev down` stops it (SIGTERM: it stops cleanly). Its pid file,
its log, the settings it was started with and faust-streaming's small local folder are in
`.stack/history/<prefix>/` (its state itself is in Kafka). `up` waits only until the
command has started (its first line in the log, about a second), not until the app has
joined its group and recovered its tables: the reports wait in Kafka meanwhile. Nothing
restarts one that exited (a crash exits 1, its log says why); the next `up` starts it
again, which is safe at any point (its transactions count each report once).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from stream_jobs.errors import PrerequisiteMissing
from stream_jobs.naming import stats_topic
from stream_jobs.settings import Settings
from stream_jobs.stack.process import ServiceStatus, read_pid, spawn, stop_pid, wait_until

# The command's first line (stream_jobs/cli/history.py): its settings are read and
# faust-streaming is imported.
STARTED = "history of prefix"
START_TIMEOUT_S = 30.0
# Its own stop takes under a second (measured 0.4 s); SIGKILL after this.
STOP_GRACE_S = 30.0


def cli_path() -> str:
    """The `stream-jobs` command of this Python's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("stream-jobs")
    if beside.is_file():
        return str(beside)
    found = shutil.which("stream-jobs")
    if found is None:
        raise PrerequisiteMissing("The stream-jobs command is not installed beside this "
                                  "Python or on PATH: run `make setup`.")
    return found


class HistoryProcess:
    """`stream-jobs history` of one prefix (the settings', unless `prefix` names another)."""

    def __init__(self, settings: Settings, prefix: str | None = None) -> None:
        self.settings = settings
        self.prefix = prefix or settings.topic_prefix
        self.home = settings.stack_dir.resolve() / "history" / self.prefix
        self.pid_file = self.home / "history.pid"
        self.log_file = self.home / "history.log"
        # The STREAM_JOBS_* it was started with: a later `up` that wants others restarts it.
        self.env_file = self.home / "history.env"
        self.data_dir = self.home / "data"

    @classmethod
    def known(cls, settings: Settings) -> list[HistoryProcess]:
        """The settings' prefix's, then those of other prefixes that run on this stack."""
        root = settings.stack_dir.resolve() / "history"
        others = [cls(settings, p.name) for p in sorted(root.glob("*"))
                  if p.is_dir() and p.name != settings.topic_prefix]
        return [cls(settings), *(other for other in others if other.pid() is not None)]

    @property
    def marker(self) -> str:
        """What its command line holds (a pid file naming another process is stale)."""
        return f"--topic-prefix {self.prefix} history"

    def pid(self) -> int | None:
        return read_pid(self.pid_file, self.marker)

    def wanted(self, kafka_bootstrap: str, database_url: str) -> dict[str, str]:
        return {
            "STREAM_JOBS_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "STREAM_JOBS_DATABASE_URL": database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": self.settings.database_schema,
            "STREAM_JOBS_TOPIC_PREFIX": self.prefix,
            "STREAM_JOBS_HISTORY_DATA_DIR": str(self.data_dir),
        }

    def started_with(self) -> dict[str, str]:
        try:
            lines = self.env_file.read_text().splitlines()
        except OSError:
            return {}
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def up(self, kafka_bootstrap: str, database_url: str) -> int:
        """Start it unless it runs with these settings (one with others is restarted);
        returns its pid once the command has started."""
        wanted = self.wanted(kafka_bootstrap, database_url)
        pid = self.pid()
        if pid is not None:
            if self.started_with() == wanted:
                return pid
            stop_pid(pid, STOP_GRACE_S)
            self.pid_file.unlink(missing_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.env_file.touch(mode=0o600)  # a database URL may hold a password
        self.env_file.chmod(0o600)
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in wanted.items()))
        start = self.log_file.stat().st_size if self.log_file.exists() else 0
        pid = spawn([cli_path(), "--topic-prefix", self.prefix, "history"], self.log_file,
                    self.pid_file, cwd=self.home, env={**os.environ, **wanted})
        wait_until(lambda: STARTED in self._log_after(start),
                   alive=lambda: self.pid() is not None, timeout_s=START_TIMEOUT_S,
                   what=f"The history of prefix {self.prefix}", log_file=self.log_file)
        return pid

    def _log_after(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def down(self) -> list[str]:
        pid = self.pid()
        if pid is None:
            return []
        stop_pid(pid, STOP_GRACE_S)
        self.pid_file.unlink(missing_ok=True)
        return [f"{self.name} (pid {pid})"]

    @property
    def name(self) -> str:
        return f"history {self.prefix}"

    def status(self) -> ServiceStatus:
        pid = self.pid()
        schema = self.started_with().get("STREAM_JOBS_DATABASE_SCHEMA",
                                         self.settings.database_schema)
        return ServiceStatus(
            name=self.name,
            running=pid is not None,
            pid=pid,
            address=f"{stats_topic(self.prefix)} -> schema {schema}",
            # Where its windows are read: `stats --history`, `serve`.
            connect=f"STREAM_JOBS_TOPIC_PREFIX={self.prefix} "
                    f"STREAM_JOBS_DATABASE_SCHEMA={schema}",
            log=self.log_file,
        )
