"""Celery and Dramatiq on Redis, side by side on the same box: enqueue rate and no-op
processing rate, each with its own best settings.

They live in their own venv (`ops/bench/.venv-peers`, made here when missing) so they
never become dependencies of stream-jobs. Redis is Debian's `redis-server`, started on
127.0.0.1:6390 with its folder under `ops/bench/out/redis` (no persistence) and stopped
afterwards. Per run: FLUSHALL, enqueue N one by one, then start the workers and time
from their first task to their last (worker start-up left out, as for ours).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from ops.bench.backlog import new_backlog, rewind_worker_group
from ops.bench.common import Bench, BenchError, rotated, run_async, stop_sessions
from ops.bench.ours import awaited_enqueue, drain
from ops.bench.snapshot import BENCH_DIR, CODE_DIR

PEERS_VENV = BENCH_DIR / ".venv-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
PEER_PACKAGES = ["celery[redis]", "dramatiq[redis]", "redis"]
REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6390
# Celery's fastest pool for a no-op task on this box in a pilot (N=5,000-8,000 each):
# solo ~600/s, threads(8) ~490/s, prefork(2) ~410/s, gevent(100) ~400/s. Solo runs one
# task at a time, so one solo worker process per core.
CELERY_POOL = "solo"
CELERY_WORKERS = 2
DRAMATIQ_PROCESSES = 2
DRAMATIQ_THREADS = 8


def ensure_peers_venv() -> Path:
    """The peers' Python, making their venv (python3 -m venv + pip install) if missing."""
    if PEERS_PYTHON.is_file():
        return PEERS_PYTHON
    steps = [["python3", "-m", "venv", str(PEERS_VENV)],
             [str(PEERS_VENV / "bin" / "pip"), "install", "-q", *PEER_PACKAGES]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            shutil.rmtree(PEERS_VENV, ignore_errors=True)
            raise BenchError(f"could not make the peers' venv: {done.stderr.strip()[-600:]}")
    return PEERS_PYTHON


def ensure_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() != 0:
        raise BenchError("redis-server is missing: apt-get install -y redis-server")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    found = shutil.which("redis-server")
    if done.returncode != 0 or not found:
        raise BenchError(f"apt-get install redis-server failed: {done.stderr[-400:]}")
    return found


def redis_command(*args: str, timeout_s: float = 5.0) -> bytes:
    """One command over RESP on the bench's Redis; its first reply line."""
    frame = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=timeout_s) as conn:
        conn.sendall(frame.encode())
        return conn.recv(4096).split(b"\r\n", 1)[0]


class RedisServer:
    """A redis-server of the bench's own, on 127.0.0.1:6390, in out/redis."""

    def __init__(self, binary: str, folder: Path) -> None:
        self.binary = binary
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            if probe.connect_ex((REDIS_HOST, REDIS_PORT)) == 0:
                raise BenchError(f"port {REDIS_PORT} is taken; the bench's Redis needs it")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(REDIS_PORT), "--bind", REDIS_HOST,
             "--dir", str(self.folder), "--save", "", "--appendonly", "no",
             "--logfile", str(self.folder / "redis.log"), "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                if redis_command("PING") == b"+PONG":
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.__exit__(None, None, None)
        raise BenchError("the bench's redis-server did not answer within 10 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
            self.proc = None

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
        return out.split("v=")[1].split()[0] if "v=" in out else out.strip()


def _peer_env(queue: str) -> dict[str, str]:
    return {**os.environ, "BENCH_REDIS_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/0",
            "BENCH_QUEUE": queue, "PYTHONPATH": str(CODE_DIR)}


def _json_of(argv: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    try:
        done = subprocess.run(argv, cwd=CODE_DIR, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{' '.join(argv[1:4])} did not finish in {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv[1:4])} failed: {done.stderr.strip()[-600:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _worker_argv(peer: str, queue: str, index: int) -> list[str]:
    bin_dir = PEERS_VENV / "bin"
    if peer == "celery":
        return [str(bin_dir / "celery"), "-A", "ops.bench.peer_celery", "worker",
                "--pool", CELERY_POOL, "-n", f"bench{index}@{queue}", "-Q", queue,
                "--without-heartbeat", "--without-gossip", "--without-mingle",
                "--loglevel", "WARNING"]
    return [str(bin_dir / "dramatiq"), "ops.bench.peer_dramatiq", "--processes",
            str(DRAMATIQ_PROCESSES), "--threads", str(DRAMATIQ_THREADS), "--queues", queue]


def peer_run(peer: str, queue: str, n: int, log_dir: Path) -> dict[str, float]:
    env = _peer_env(queue)
    redis_command("FLUSHALL")
    enq = _json_of([str(PEERS_PYTHON), "-m", f"ops.bench.peer_{peer}", "enqueue", "--n", str(n)],
                   env, 60 + n / 50)
    count = CELERY_WORKERS if peer == "celery" else 1
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(count):
            with (log_dir / f"{queue}-{i}.log").open("wb") as log:
                procs.append(subprocess.Popen(_worker_argv(peer, queue, i), cwd=CODE_DIR,
                                              env=env, stdout=log, stderr=log,
                                              start_new_session=True))
        done = _json_of([str(PEERS_PYTHON), "-m", "ops.bench.peer_common", "wait", "--n",
                         str(n), "--timeout", str(int(120 + n / 50))], env, 180 + n / 50)
    finally:
        stop_sessions(procs, within_s=20)
    return {"enqueue_rate": enq["rate"], "enqueue_p50_ms": enq["p50_ms"],
            "enqueue_p99_ms": enq["p99_ms"], "process_rate": done["rate"]}


def peers(b: Bench) -> None:
    python = ensure_peers_venv()
    binary = ensure_redis_server()
    n = b.scale.peer_n
    log_dir = b.out_dir / "peers"
    log_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, list[dict[str, float]]] = {"celery": [], "dramatiq": [], "ours": []}
    # Ours runs in the same rotation, so the ratios to the peers are side by side: awaited
    # enqueues one by one (as the peers enqueue), then a drain of a 5N backlog, rewound.
    s = b.settings()
    backlog_n = n * 5
    run_async(b.declare("bench.beside-enqueue"), 60)
    new_backlog(b, "bench.beside-noop", backlog_n)
    with RedisServer(binary, b.out_dir / "redis") as server:
        b.results.meta.setdefault("versions", {})["redis-server"] = server.version()
        for run in range(b.scale.runs):
            for peer in rotated(["celery", "dramatiq", "ours"], run):
                if peer == "ours":
                    enqueue_rate, _ = run_async(awaited_enqueue(s, "bench.beside-enqueue", n), 600)
                    drained = run_async(drain(s, "bench.beside-noop", backlog_n), 900)
                    run_async(rewind_worker_group(s, "bench.beside-noop"), 60)
                    found[peer].append({"enqueue_rate": enqueue_rate,
                                        "process_rate": drained["rate"]})
                    continue
                queue = f"{b.prefix}-{peer}-{run}"
                found[peer].append(peer_run(peer, queue, n, log_dir))
    versions = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, json; print(json.dumps("
         "{p: m.version(p) for p in ('celery', 'kombu', 'dramatiq', 'redis')}))"],
        capture_output=True, text=True, timeout=60, check=False)
    if versions.returncode == 0:
        b.results.meta.setdefault("versions", {}).update(json.loads(versions.stdout))
    b.results.details["peers"] = found
    r = b.results
    celery_cfg = (f"{CELERY_WORKERS} workers, pool {CELERY_POOL}, prefetch multiplier 128, "
                  "results ignored, acks early (default)")
    dramatiq_cfg = (f"{DRAMATIQ_PROCESSES} processes x {DRAMATIQ_THREADS} threads, RedisBroker, "
                    "default middleware, max_retries 0")
    for peer, cfg in (("celery", celery_cfg), ("dramatiq", dramatiq_cfg)):
        runs = found[peer]
        r.add(f"{peer}.enqueue", f"{peer.title()} enqueue, one by one", "jobs/s",
              [x["enqueue_rate"] for x in runs], f"{n:,} calls")
        r.add(f"{peer}.enqueue_p99", f"{peer.title()} enqueue latency p99", "ms",
              [x["enqueue_p99_ms"] for x in runs])
        r.add(f"{peer}.process", f"{peer.title()} no-op processing", "jobs/s",
              [x["process_rate"] for x in runs], f"{n:,} tasks; {cfg}")
    beside = found["ours"]
    r.add("ours.enqueue_awaited_beside", "enqueue, awaited one by one (beside the peers)",
          "jobs/s", [x["enqueue_rate"] for x in beside],
          f"{n:,} calls, in the peers' rotation")
    r.add("ours.noop_key_beside", "no-op processing, key (beside the peers)", "jobs/s",
          [x["process_rate"] for x in beside],
          f"{backlog_n:,} jobs backlog, in the peers' rotation")
