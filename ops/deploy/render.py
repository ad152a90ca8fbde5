"""Render the deploy files of every job type in topics/, so they stay in step with it.

    .venv/bin/python ops/deploy/render.py            # rewrite the files below
    .venv/bin/python ops/deploy/render.py --check    # exit 1 if they are out of date

One deployable unit per type (its handlers and its delay relay), three ways:

- compose.workers.yml: a service per type, next to the stack in docker-compose.yml;
- systemd/: the template unit stream-jobs-worker@.service (instance = type), the shared
  settings stream-jobs.env, and one <type>.env per type (which app runs it); beside them
  stream-jobs-workers.service, the other shape: every type of the app in one unit, a
  worker process per CPU under one supervisor (`worker APP --processes auto`);
- k8s/: config.yaml (settings, and a Job that applies topics/ and migrates), and per type
  a Deployment with a KEDA ScaledObject that scales it on the lag of group P.T.worker.

Beside them, each way, the history process of the prefix (`stream-jobs history`): one
replica, restarted when it exits on an error, with a folder of its own for
faust-streaming's small local files (its state is in Kafka).

Names come from stream_jobs.naming and the policy from topics/*.toml: the most replicas
KEDA runs is the type's partition count, because more consumers than partitions sit idle.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from a checkout

from ops.deploy.kubernetes import k8s_config, k8s_history, k8s_type  # noqa: E402
from ops.deploy.options import (  # noqa: E402
    CONTAINER_HISTORY_DIR,
    GENERATED,
    HEALTH_PROBE,
    HISTORY_COMMAND,
    HISTORY_STOP_GRACE_S,
    HISTORY_UNIT,
    METRICS_PORT,
    STOP_GRACE_S,
    SYSTEMD_HISTORY_STATE,
    Options,
    command,
    q,
    slug,
)
from stream_jobs.job_types import JobTypePolicy, load_job_types  # noqa: E402
from stream_jobs.naming import worker_group  # noqa: E402

# -- compose ------------------------------------------------------------------------------



# An app service of the compose file starts once the broker and Postgres answer and the
# setup service (topics apply, db migrate) has finished.
_DEPENDS_ON = (
    "    depends_on:",
    "      kafka:",
    "        condition: service_healthy",
    "      postgres:",
    "        condition: service_healthy",
    "      setup:",
    "        condition: service_completed_successfully",
)


def compose(types: Mapping[str, JobTypePolicy], opts: Options) -> str:
    out = [
        f"# {GENERATED}.",
        "# One service per job type, and the history process of their prefix (it merges",
        "# with docker-compose.yml's), on the stack of docker-compose.yml (paths are relative",
        "# to the first file, the repository root):",
        "#",
        "#   docker compose -f docker-compose.yml -f ops/deploy/compose.workers.yml up -d --build",
        "#   docker compose -f docker-compose.yml -f ops/deploy/compose.workers.yml \\",
        "#       up -d --scale worker-email-send=3        # more processes of one type",
        "#",
        "# A type's replicas beyond its partition count sit idle. A service can also run",
        "# every type (`stream-jobs worker APP`, no --type) on all its CPUs",
        "# (`--processes auto`): docs/deploying.md says when that shape fits.",
        "services:",
    ]
    for policy in types.values():
        out += [
            f"  worker-{slug(policy.job_type)}:",
            f"    image: {q(opts.image)}",
            "    build:",
            "      context: .",
            "      dockerfile: ops/deploy/Dockerfile",
            f"    command: {q(command(opts, policy))}",
            "    labels:",
            f"      stream-jobs.job-type: {q(policy.job_type)}",
            "    environment:",
            "      STREAM_JOBS_KAFKA_BOOTSTRAP: kafka:19092",
            "      STREAM_JOBS_DATABASE_URL: postgresql://stream_jobs@postgres:5432/stream_jobs",
            f"      STREAM_JOBS_TOPIC_PREFIX: {q(opts.prefix)}",
            "      STREAM_JOBS_TOPICS_DIR: /app/topics",
            f"      STREAM_JOBS_METRICS_PORT: {METRICS_PORT}",
            *_DEPENDS_ON,
            "    healthcheck:",
            f"      test: {q(HEALTH_PROBE)}",
            "      interval: 15s",
            "      timeout: 10s",
            "      retries: 3",
            "      start_period: 30s",
            "    restart: on-failure",
            f"    stop_grace_period: {STOP_GRACE_S}s",
            "    deploy:",
            "      replicas: 1",
        ]
    return "\n".join(out + compose_history(opts)) + "\n"


def compose_history(opts: Options) -> list[str]:
    """The history service, as docker-compose.yml has it, on this file's prefix."""
    return [
        "  # The history process of the prefix: one is enough (a second would wait as a",
        "  # standby); a crash exits 1 and is restarted, which is safe (its state is in Kafka).",
        "  history:",
        f"    image: {q(opts.image)}",
        "    build:",
        "      context: .",
        "      dockerfile: ops/deploy/Dockerfile",
        f"    command: {q(HISTORY_COMMAND)}",
        "    environment:",
        "      STREAM_JOBS_KAFKA_BOOTSTRAP: kafka:19092",
        "      STREAM_JOBS_DATABASE_URL: postgresql://stream_jobs@postgres:5432/stream_jobs",
        f"      STREAM_JOBS_TOPIC_PREFIX: {q(opts.prefix)}",
        "      STREAM_JOBS_TOPICS_DIR: /app/topics",
        f"      STREAM_JOBS_HISTORY_DATA_DIR: {CONTAINER_HISTORY_DIR}",
        *_DEPENDS_ON,
        "    restart: on-failure",
        f"    stop_grace_period: {HISTORY_STOP_GRACE_S}s",
        "    deploy:",
        "      replicas: 1",
    ]


# -- systemd ------------------------------------------------------------------------------


def _systemd(opts: Options, comment: str, description: str, service: str,
             stop_s: int = STOP_GRACE_S) -> str:
    """A unit: `comment` at its top, and in [Service], between the lines every unit
    shares, the lines that are its own (`service`)."""
    return f"""\
# {GENERATED}.
{comment}
[Unit]
Description={description}
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User=stream-jobs
Group=stream-jobs
WorkingDirectory={opts.install_dir}
EnvironmentFile=/etc/stream-jobs/stream-jobs.env
{service}
TimeoutStopSec={stop_s}
Restart=on-failure
RestartSec=5
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
"""


def systemd_unit(opts: Options) -> str:
    bin_dir = f"{opts.install_dir}/.venv/bin"
    return _systemd(opts, """\
# One process of one job type: `systemctl enable --now stream-jobs-worker@email.send`.
# The instance name is the type; /etc/stream-jobs/<type>.env says which app runs it.
# Every type in one unit, on all CPUs, instead: stream-jobs-workers.service.""",
                    "stream-jobs worker for job type %i", f"""\
EnvironmentFile=/etc/stream-jobs/%i.env
ExecStart={bin_dir}/stream-jobs worker ${{STREAM_JOBS_APP}} --type %i
# SIGTERM drains: no new jobs, running ones get their grace period, offsets commit.
KillSignal=SIGTERM""")


def systemd_all_types_unit(opts: Options) -> str:
    bin_dir = f"{opts.install_dir}/.venv/bin"
    return _systemd(opts, f"""\
# Every job type of {opts.app} in one unit, one worker process per CPU under a supervisor
# that restarts any that dies: `systemctl enable --now stream-jobs-workers`. Use it or the
# per-type template stream-jobs-worker@.service for a type, not both on one host.""",
                    f"stream-jobs workers for every job type of {opts.app}", f"""\
ExecStart={bin_dir}/stream-jobs worker {opts.app} --processes auto
# SIGTERM to the supervisor drains every worker process (it forwards the signal and waits
# up to 30 s); mixed: only the supervisor gets it, the rest get SIGKILL at the timeout.
KillSignal=SIGTERM
KillMode=mixed""")


def systemd_history_unit(opts: Options) -> str:
    bin_dir = f"{opts.install_dir}/.venv/bin"
    return _systemd(opts, """\
# The history process of the prefix in stream-jobs.env (`stream-jobs history`):
# `systemctl enable --now stream-jobs-history` on one host. One is enough; on a second host
# it waits as a standby (the reports topic has one partition) and takes over if this one
# stops. A crash exits 1 and Restart=on-failure starts it again, which is safe: its state
# is in Kafka, and its transactions count each report once.""",
                    f"stream-jobs history of prefix {opts.prefix}", f"""\
# faust-streaming's small local files, in /var/lib/{SYSTEMD_HISTORY_STATE} (ProtectSystem=strict
# leaves only this writable).
StateDirectory={SYSTEMD_HISTORY_STATE}
Environment=STREAM_JOBS_HISTORY_DATA_DIR=/var/lib/{SYSTEMD_HISTORY_STATE}
ExecStart={bin_dir}/{" ".join(HISTORY_COMMAND)}
# SIGTERM stops it cleanly: its last transaction commits or aborts, nothing is lost.
KillSignal=SIGTERM""", stop_s=HISTORY_STOP_GRACE_S)


def systemd_shared_env(opts: Options) -> str:
    return f"""\
# {GENERATED}.
# /etc/stream-jobs/stream-jobs.env: settings every worker on this host shares (mode 0600,
# it may hold a password). Every STREAM_JOBS_* setting (docs/reference/settings.md) can go here.
STREAM_JOBS_KAFKA_BOOTSTRAP={opts.bootstrap}
STREAM_JOBS_DATABASE_URL=postgresql://stream_jobs@db.internal:5432/stream_jobs
STREAM_JOBS_TOPIC_PREFIX={opts.prefix}
STREAM_JOBS_TOPICS_DIR={opts.install_dir}/topics
STREAM_JOBS_LOG_LEVEL=INFO
"""


def systemd_type_env(policy: JobTypePolicy, opts: Options) -> str:
    return f"""\
# {GENERATED}.
# /etc/stream-jobs/{policy.job_type}.env, read by stream-jobs-worker@{policy.job_type}.
# Group {worker_group(opts.prefix, policy.job_type)}; {policy.partitions} partitions, so at
# most {policy.partitions} processes of this type do work (one per host with this unit).
STREAM_JOBS_APP={opts.app}
"""


# -- all of it ----------------------------------------------------------------------------


def render(types: Mapping[str, JobTypePolicy], opts: Options) -> dict[str, str]:
    """Relative path under ops/deploy -> file text."""
    ordered = {name: types[name] for name in sorted(types)}
    files = {
        "compose.workers.yml": compose(ordered, opts),
        "systemd/stream-jobs-worker@.service": systemd_unit(opts),
        "systemd/stream-jobs-workers.service": systemd_all_types_unit(opts),
        f"systemd/{HISTORY_UNIT}.service": systemd_history_unit(opts),
        "systemd/stream-jobs.env": systemd_shared_env(opts),
        "k8s/config.yaml": k8s_config(opts),
        f"k8s/{HISTORY_UNIT}.yaml": k8s_history(opts),
    }
    for name, policy in ordered.items():
        for path in (f"systemd/{name}.env", f"k8s/{name}.yaml"):
            if path in files:
                raise SystemExit(f"topics/{name}.toml: a type of that name would overwrite "
                                 f"ops/deploy/{path}; rename the type.")
        files[f"systemd/{name}.env"] = systemd_type_env(policy, opts)
        files[f"k8s/{name}.yaml"] = k8s_type(policy, opts)
    return files


def main(argv: list[str] | None = None) -> int:
    d = Options()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topics", type=Path, default=REPO / "topics")
    p.add_argument("--out", type=Path, default=REPO / "ops" / "deploy")
    p.add_argument("--app", default=d.app, help="MODULE:APP that has the handlers")
    p.add_argument("--image", default=d.image)
    p.add_argument("--prefix", default=d.prefix, help="STREAM_JOBS_TOPIC_PREFIX")
    p.add_argument("--bootstrap", default=d.bootstrap, help="Kafka as the cluster sees it")
    p.add_argument("--lag-threshold", type=int, default=d.lag_threshold,
                   help="jobs waiting per replica before KEDA adds one")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = p.parse_args(argv)
    opts = Options(app=args.app, image=args.image, prefix=args.prefix,
                   bootstrap=args.bootstrap, lag_threshold=args.lag_threshold)
    files = render(load_job_types(args.topics), opts)
    stale = sorted(path for path, text in files.items()
                   if not (args.out / path).is_file() or (args.out / path).read_text() != text)
    # Files of types that no longer exist are stale too.
    rendered_dirs = ("systemd", "k8s")
    extra = sorted(str(f.relative_to(args.out)) for d_ in rendered_dirs
                   for f in (args.out / d_).glob("*") if f.is_file()
                   and str(f.relative_to(args.out)) not in files)
    if args.check:
        for path in stale + extra:
            print(f"out of date: ops/deploy/{path}", file=sys.stderr)
        return 1 if stale or extra else 0
    for path in extra:
        (args.out / path).unlink()
        print(f"removed {path}")
    for path in stale:
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(files[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
