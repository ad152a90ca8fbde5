"""A real PostgreSQL server (Debian's `postgresql` package) for the local stack.

Postgres refuses to run as root, so when we are root the server runs as an unprivileged
OS user (`STREAM_JOBS_DEV_POSTGRES_OS_USER`, default `postgres`) in a data folder of ours,
listening on 127.0.0.1 only, with trust authentication for loopback (development only).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from stream_jobs.errors import PrerequisiteMissing, StackError
from stream_jobs.settings import Settings
from stream_jobs.stack.process import ServiceStatus, ensure_port_free, pid_alive

HOST = "127.0.0.1"
SUPERUSER = "stream_jobs"


def postgres_bindir() -> Path:
    """The newest installed server's bin folder (Debian keeps them per major version)."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                        else 0)
    if candidates:
        return candidates[-1].parent
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    raise PrerequisiteMissing(
        "PostgreSQL is not installed: run `make setup` (it installs Debian's postgresql package)."
    )


class PostgresServer:
    """The stack's Postgres: `up` initialises, starts and creates the database; `down` stops it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = settings.dev_postgres_port
        self.home = self._home(settings.stack_dir.resolve() / "postgres")
        self.data = self.home / "data"
        self.socket_dir = self.home / "run"
        self.log_file = self.home / "postgres.log"
        self.database = urlsplit(settings.database_url).path.lstrip("/") or "stream_jobs"
        if not self.database.replace("_", "").isalnum():
            raise StackError(f"The database name {self.database!r} in STREAM_JOBS_DATABASE_URL "
                             "must be letters, digits and underscores for the local stack.")

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/{self.database}"

    @property
    def _as_root(self) -> bool:
        return os.geteuid() == 0

    def _os_user(self) -> pwd.struct_passwd:
        name = self.settings.dev_postgres_os_user
        try:
            return pwd.getpwnam(name)
        except KeyError as exc:
            raise PrerequisiteMissing(
                f"The OS user {name!r} that runs Postgres does not exist: run `make setup` "
                "or set STREAM_JOBS_DEV_POSTGRES_OS_USER to an unprivileged user."
            ) from exc

    def _home(self, preferred: Path) -> Path:
        """Our data folder, or one in /var/tmp when the unprivileged user cannot reach ours.

        A checkout under a private folder (e.g. /root) is not traversable by that user.
        """
        if os.geteuid() != 0:
            return preferred
        user = self.settings.dev_postgres_os_user
        parent = preferred.parent
        parent.mkdir(parents=True, exist_ok=True)
        reachable = subprocess.run(["runuser", "-u", user, "--", "test", "-x", str(parent)],
                                   capture_output=True, check=False).returncode == 0
        if reachable:
            return preferred
        tag = hashlib.sha256(str(preferred).encode()).hexdigest()[:10]
        return Path("/var/tmp") / f"stream-jobs-{tag}" / "postgres"

    def _run(self, argv: list[str], check_what: str) -> subprocess.CompletedProcess[str]:
        if self._as_root:
            argv = ["runuser", "-u", self.settings.dev_postgres_os_user, "--", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise StackError(f"{check_what} failed: {' '.join(detail)} (log: {self.log_file})")
        return result

    def _check_ownership(self) -> None:
        if not self.data.exists() or not self._as_root:
            return
        owner = self.data.stat().st_uid
        if owner == 0:
            raise StackError(
                f"The Postgres data folder {self.data} is owned by root, and Postgres refuses "
                f"to run as root: remove it or `chown -R {self.settings.dev_postgres_os_user} "
                f"{self.data}`."
            )

    def _prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self._check_ownership()
        if self._as_root:
            user = self._os_user()
            for path in (self.home, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
            self.home.chmod(0o755)
        if not (self.data / "PG_VERSION").is_file():
            self.data.mkdir(mode=0o700, exist_ok=True)
            if self._as_root:
                user = self._os_user()
                os.chown(self.data, user.pw_uid, user.pw_gid)
            self._run([str(postgres_bindir() / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
                       "--auth=trust", "-E", "UTF8", "--no-locale"], "initdb")

    def running_pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if pid_alive(pid) else None

    def up(self) -> None:
        """Initialise (first time), start and create the database; idempotent."""
        bindir = postgres_bindir()
        self._prepare()
        if self.running_pid() is None:
            ensure_port_free(HOST, self.port, "Postgres", "STREAM_JOBS_DEV_POSTGRES_PORT")
            if not self.log_file.exists():
                self.log_file.touch()
            if self._as_root:
                user = self._os_user()
                os.chown(self.log_file, user.pw_uid, user.pw_gid)
            options = (f"-p {self.port} -k {self.socket_dir} -c listen_addresses={HOST} "
                       "-c fsync=on -c max_connections=200")
            self._run([str(bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_file),
                       "-o", options, "-w", "-t", "60", "start"], "Starting Postgres")
        self._create_database(bindir)

    def _create_database(self, bindir: Path) -> None:
        psql = [str(bindir / "psql"), "-h", HOST, "-p", str(self.port), "-U", SUPERUSER,
                "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-tAc"]
        exists = self._run([*psql, f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"],
                           "Looking up the database")
        if exists.stdout.strip() != "1":
            self._run([*psql, f'CREATE DATABASE "{self.database}"'], "Creating the database")

    def down(self) -> list[str]:
        pid = self.running_pid()
        if pid is None:
            return []
        self._run([str(postgres_bindir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                   "stop"], "Stopping Postgres")
        return [f"postgres (pid {pid})"]

    def status(self) -> ServiceStatus:
        pid = self.running_pid()
        return ServiceStatus(
            name="postgres",
            running=pid is not None,
            pid=pid,
            address=f"{HOST}:{self.port}",
            connect=f"STREAM_JOBS_DATABASE_URL={self.dsn}",
            log=self.log_file,
        )
