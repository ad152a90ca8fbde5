"""`make bench`: every section in one run on this box, then RESULTS.md.

    .venv/bin/python -m ops.bench.run            # full: 3 runs per figure, ~30 minutes
    BENCH_QUICK=1 .venv/bin/python -m ops.bench.run   # smoke: small N, 1 run, < 3 minutes
    BENCH_ONLY=scaling .venv/bin/python -m ops.bench.run   # some sections only (comma list)
    BENCH_ONLY=processes .venv/bin/python -m ops.bench.run # worker --processes 2 against 1
    BENCH_ONLY=results .venv/bin/python -m ops.bench.run   # keep_result and batch members
    BENCH_ONLY=tester .venv/bin/python -m ops.bench.run    # JobTester beside the real stack
    BENCH_ONLY=tracing .venv/bin/python -m ops.bench.run   # what tracing costs the no-op path
    BENCH_ONLY=share .venv/bin/python -m ops.bench.run     # Kafka share groups against our worker
    BENCH_ONLY=confluent .venv/bin/python -m ops.bench.run # confluent-kafka beside aiokafka
    BENCH_SKIP=scaling .venv/bin/python -m ops.bench.run   # full, but keep Scaling's last

The code under test (stream_jobs/, ops/bench/) is copied to ops/bench/out/code first and
the bench runs from that copy. The full run writes ops/bench/out/results.json and
ops/bench/RESULTS.md; the quick one writes ops/bench/out/results-quick.json and
ops/bench/out/RESULTS-quick.md, leaving the published figures alone. A partial run
(BENCH_ONLY) writes out/results-partial.json; in RESULTS.md it replaces only the sections
that own a heading of their own (report.OWN_HEADINGS, e.g. scaling) and keeps the rest,
and its whole report goes to out/RESULTS-partial.md. A section that fails
is recorded and the others still run; the exit status is 1 if any failed. Goals that are
missed do not fail the run: they are what RESULTS.md is for.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from ops.bench import (
    confluent,
    control,
    fairness,
    fencing,
    gateway,
    kafka_tools,
    latency,
    memory,
    ours,
    outbox,
    peers,
    processes,
    profile,
    retry,
    scaling,
    schedules,
    share_groups,
    sync_noop,
    tester,
    tracing,
)
from ops.bench import results as results_section  # `results` names the run's Results
from ops.bench.backlog import ENQUEUE_BATCH, payload_bytes
from ops.bench.common import (
    FETCH_RECORDS,
    FULL,
    PARTITIONS,
    QUICK,
    Bench,
    BenchError,
    Results,
    delete_topics,
    event_loop_name,
    run_async,
)
from ops.bench.raw import record_bytes, typical_record
from ops.bench.report import OWN_HEADINGS, merge_sections, render
from ops.bench.snapshot import BENCH_DIR, CODE_DIR, OUT_DIR, REPO_DIR, SNAPSHOT_ENV
from stream_jobs.kafka.admin import admin_client
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings, load_settings
from stream_jobs.stack import KafkaCluster, PostgresServer
from stream_jobs.stack.kafka import kafka_version, ops_dir
from stream_jobs.testing.stack import drop_schema

Section = tuple[str, Callable[[Bench], None]]


def _loopback_only(settings: Settings) -> None:
    hosts = [server.rpartition(":")[0] for server in settings.bootstrap_servers]
    hosts.append(urlsplit(settings.database_url).hostname or "")
    for host in hosts:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise BenchError(f"the bench runs against loopback services only, not {host}")


def _on_the_dev_stack(base: Settings) -> Settings:
    """`make bench` starts the dev stack (`stream-jobs dev up`, on STREAM_JOBS_DEV_*_PORT);
    without an explicit STREAM_JOBS_KAFKA_BOOTSTRAP or STREAM_JOBS_DATABASE_URL the bench
    measures that stack, so a stack on other ports (one per session) is the one measured."""
    update: dict[str, object] = {}
    stack = base.model_copy(update={"stack_dir": REPO_DIR / base.stack_dir})
    if "STREAM_JOBS_KAFKA_BOOTSTRAP" not in os.environ:
        update["kafka_bootstrap"] = KafkaCluster(stack, 1).bootstrap
    if "STREAM_JOBS_DATABASE_URL" not in os.environ:
        update["database_url"] = PostgresServer(stack).dsn
    return base.model_copy(update=update)


def _write_report(text: str, md_path: Path, only: set[str], quick: bool,
                  skipped: set[str]) -> list[Path]:
    """Write the run's report; a partial run merges only its own sections into RESULTS.md,
    and a full run that skipped sections with headings of their own keeps their last
    results."""
    if quick:
        md_path.write_text(text)
        return [md_path]
    if not only:
        kept = [OWN_HEADINGS[name] for name in sorted(skipped) if name in OWN_HEADINGS]
        old = md_path.read_text() if kept and md_path.is_file() else ""
        md_path.write_text(merge_sections(text, old, kept) if old else text)
        return [md_path]
    written = [OUT_DIR / "RESULTS-partial.md"]
    written[0].write_text(text)
    own = [OWN_HEADINGS[name] for name in sorted(only) if name in OWN_HEADINGS]
    if own:
        old = md_path.read_text() if md_path.is_file() else ""
        md_path.write_text(merge_sections(old, text, own) if old else text)
        written.append(md_path)
    return written


def _machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return {"nproc": os.cpu_count(), "memory_gib": round(mem_kb / 1024 / 1024, 1),
            "cpu_model": model, "kernel": platform.release(),
            "load_avg_at_start": os.getloadavg()}


def _run_text(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (done.stdout + done.stderr).strip()


async def _broker_topics(settings: Settings) -> int:
    async with admin_client(settings) as admin:
        return len(await admin.list_topics())


async def _postgres_version(settings: Settings) -> str:
    conn = await asyncpg.connect(settings.database_url)
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


def _versions(settings: Settings) -> dict[str, str]:
    found = {"python": platform.python_version(),
             "kafka": kafka_version(ops_dir() / "kafka" / "pom.xml"),
             "java": _run_text(["java", "-version"]).splitlines()[0],
             "postgres": run_async(_postgres_version(settings), 30)}
    for package in ("stream-jobs", "aiokafka", "asyncpg", "orjson", "pydantic", "pyinstrument"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    from aiokafka.record import default_records

    builder = default_records.DefaultRecordBatchBuilder
    found["aiokafka C extension"] = "yes" if "_crecords" in builder.__module__ else "no"
    commit = _run_text(["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"])
    dirty = _run_text(["git", "-C", str(REPO_DIR), "status", "--porcelain", "stream_jobs"])
    found["stream-jobs commit"] = commit + (" + uncommitted changes in stream_jobs/"
                                            if dirty else "")
    return found


def _settings_table(b: Bench) -> dict[str, Any]:
    s = b.base
    record = typical_record(b.settings())
    return {
        "partitions per topic": PARTITIONS,
        "payload": f"{payload_bytes()} B JSON dict (handlers take `dict`, no pydantic model)",
        "record on the wire": f"{record_bytes(record)} B (value + key + {len(record.headers())} "
                              "headers); the Kafka tools send records of this size",
        "producer": f"acks=all, idempotent, linger_ms={s.producer_linger_ms}, "
                    f"max_batch_size={min(s.producer_max_batch_bytes, 16 * 1024 * 1024)}",
        "enqueue_many batch": ENQUEUE_BATCH,
        "worker": f"concurrency 64 (default), getmany max_records {FETCH_RECORDS}, "
                  "relay on, other options at their defaults",
        "event loop (ours and raw aiokafka)": f"{event_loop_name()}, as `stream-jobs worker`",
        "runs per figure": b.scale.runs,
        "quick": b.quick,
        "topic prefix": b.prefix,
    }


def _sections() -> list[Section]:
    return [
        ("kafka tools", lambda b: kafka_tools.kafka_tools(
            b, record_bytes(typical_record(b.settings())))),
        ("enqueue", ours.enqueue),
        ("processing", ours.processing),
        ("sync", sync_noop.sync_handlers),
        ("exactly-once", ours.exactly_once),
        ("fencing", fencing.fencing),
        ("latency", latency.latency),
        ("retry", retry.retry),
        ("peers", peers.peers),
        ("schedules", schedules.schedules),
        ("profile", profile.profile),
        ("memory", memory.memory),
        ("scaling", scaling.scaling),
        ("processes", processes.processes),
        ("outbox", outbox.outbox),
        ("tester", tester.tester),
        ("results", results_section.results),
        ("control", control.control),
        ("gateway", gateway.gateway),
        ("tracing", tracing.tracing),
        ("confluent", confluent.confluent),
        ("fairness", fairness.fairness),
        ("share", share_groups.share),
    ]


def _code_digest(root: Path) -> str:
    """A digest of stream_jobs/*.py under `root`: the code a set of figures belongs to."""
    digest = hashlib.sha256()
    for path in sorted((root / "stream_jobs").rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _run_from_snapshot() -> int:
    """Copy the code under test (stream_jobs/, ops/bench/, ops/kafka/) to out/code and run
    the bench from there, so edits to the checkout during the run are not measured."""
    snapshot = OUT_DIR / "code"
    shutil.rmtree(snapshot, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__", "out", ".venv-peers", "RESULTS.md")
    shutil.copytree(REPO_DIR / "stream_jobs", snapshot / "stream_jobs", ignore=skip)
    shutil.copytree(REPO_DIR / "ops" / "bench", snapshot / "ops" / "bench", ignore=skip)
    shutil.copytree(REPO_DIR / "ops" / "kafka", snapshot / "ops" / "kafka", ignore=skip)
    env = {**os.environ, SNAPSHOT_ENV: str(snapshot), "BENCH_REPO_DIR": str(REPO_DIR),
           "PYTHONPATH": str(snapshot)}
    child = subprocess.Popen([sys.executable, "-m", "ops.bench.run"], cwd=snapshot, env=env)
    # A SIGTERM to this process reaches the run, which then cleans up (topics, schema).
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))
    try:
        return child.wait(timeout=3600)
    except subprocess.TimeoutExpired:
        print("[bench] the run took over an hour and was stopped", file=sys.stderr)
        child.terminate()
        return child.wait(timeout=120) or 1


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # As SystemExit, a SIGTERM unwinds through the `finally` blocks: subprocesses stopped,
    # this run's topics and schema removed.
    raise SystemExit(128 + signum)


def _names(variable: str) -> set[str]:
    """The comma-separated section names in an environment variable."""
    return {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}


def _run_sections(b: Bench, only: set[str], skipped: set[str], json_path: Path) -> None:
    """Each chosen section in turn; one that fails is recorded and the next still runs."""
    results = b.results
    for name, section in _sections():
        if (only and name not in only) or name in skipped:
            continue
        print(f"[bench] {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            section(b)
        except Exception as exc:
            results.errors[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        results.timings_s[name] = round(time.monotonic() - t0, 1)
        results.details.setdefault("load_avg_after", {})[name] = os.getloadavg()[0]
        state = "FAILED" if name in results.errors else "done"
        print(f"[bench] {name} {state} in {results.timings_s[name]:.0f} s", flush=True)
        results.save(json_path)


def _finish(b: Bench, began: float, measured_digest: str) -> None:
    """Remove the run's topics and schema, and note how the run ended."""
    try:
        run_async(delete_topics(b.settings(), b.prefix), 120)
        run_async(drop_schema(b.settings()), 60)
    except Exception as exc:
        print(f"[bench] cleanup failed: {exc}", file=sys.stderr)
    meta = b.results.meta
    meta["machine"]["load_avg_at_end"] = os.getloadavg()
    now_digest = _code_digest(REPO_DIR)
    meta["versions"]["stream_jobs/ digest (measured)"] = measured_digest
    if now_digest != measured_digest:
        meta["versions"]["stream_jobs/ digest (checkout at the end)"] = (
            f"{now_digest}: stream_jobs/ changed during the run; the figures are of the "
            "snapshot taken at the start")
    meta["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    meta["total_s"] = round(time.monotonic() - began, 1)


def _bench(quick: bool) -> Bench:
    """This run's context: a fresh prefix and out/run-<prefix>, on the dev stack."""
    base = _on_the_dev_stack(load_settings())
    _loopback_only(base)
    prefix = f"bench{time.strftime('%m%d%H%M')}{uuid.uuid4().hex[:4]}"
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for old in OUT_DIR.glob("run-*"):
        shutil.rmtree(old, ignore_errors=True)
    out_dir = OUT_DIR / f"run-{prefix}"
    out_dir.mkdir(parents=True)
    b = Bench(scale=QUICK if quick else FULL, quick=quick, prefix=prefix, out_dir=out_dir,
              base=base, results=Results())
    b.results.meta.update(started_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"), quick=quick,
                          machine=_machine(), versions=_versions(base))
    b.results.meta["settings"] = _settings_table(b)
    # Every client's full-metadata fetch grows with this; other users' topics count too.
    b.results.meta["machine"]["topics on the broker at start"] = run_async(
        _broker_topics(base), 60)
    return b


def main() -> int:
    if not os.environ.get(SNAPSHOT_ENV):
        return _run_from_snapshot()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    import stream_jobs

    if not Path(stream_jobs.__file__).resolve().is_relative_to(CODE_DIR):
        raise BenchError(f"stream_jobs was imported from {stream_jobs.__file__}, not the "
                         f"snapshot in {CODE_DIR}")
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    only = _names("BENCH_ONLY")
    # BENCH_SKIP=scaling: a full run without the (long) scaling section, which keeps its
    # last results in RESULTS.md.
    skipped = _names("BENCH_SKIP")
    json_path = OUT_DIR / ("results-quick.json" if quick else "results-partial.json" if only
                           else "results.json")
    md_path = OUT_DIR / "RESULTS-quick.md" if quick else BENCH_DIR / "RESULTS.md"
    measured_digest = _code_digest(CODE_DIR)
    b = _bench(quick)
    began = time.monotonic()
    print(f"[bench] prefix {b.prefix}, {'quick' if quick else 'full'} run, results in "
          f"{json_path}", flush=True)
    run_async(prepare_schema(b.settings()), 60)
    try:
        _run_sections(b, only, skipped, json_path)
    finally:
        _finish(b, began, measured_digest)
        b.results.save(json_path)
    written = _write_report(render(b.results.to_json()), md_path, only, quick, skipped)
    print(f"[bench] wrote {', '.join(map(str, written))} in {b.results.meta['total_s']:.0f} s",
          flush=True)
    return 1 if b.results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
