"""The gateway under clients without its token (`BENCH_ONLY=gateway`).

A `stream-jobs serve` process on this run's prefix. In each run an authenticated client
times awaited single-job enqueues (`POST /jobs/{type}` on one keep-alive connection),
first with nothing else going on, then while three other processes
(`python -m ops.bench.hostile`) send a 16 MB JSON body of `[[],[],...]` without the token
in a loop, reconnecting after each answer; then one more such body is timed alone, to
its status line, with the gateway's RSS before and after.

The control: the same three senders aimed at a stand-in server that is not the gateway
(it answers 401 from the headers and closes, as the gateway does). On a 2-core machine
three senders take the cores whatever they send to, so an enqueue slows down even when
the gateway does nothing for them; the control measures that, and the gateway's own
share is the enqueue's p99 with the senders at the gateway over the p99 with the
senders at the stand-in, both taken in the same run. Before the guard checked the
token from the headers, such a body was read and parsed first (2.2 s, hundreds of MiB)
and three senders made enqueues time out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ops.bench.common import Bench, BenchError, percentile, rotated, run_async
from ops.bench.hostile import JOB_TYPE, big_body, enqueue_latencies, unauthenticated_post

HEADING = "Gateway under clients without the token"
INTRO = ("An authenticated enqueue through `stream-jobs serve`, idle and while three "
         "clients without the token send 16 MB bodies (ops/bench/gateway.py says how).")
PREFIX = "gateway."
TOKEN = "bench-gateway-token"
SENDERS = 3
GOALS = [  # (text, numerator or figure, denominator or None, op, target, unit)
    ("enqueue p99 under three 16 MB senders without the token <= 2x idle",
     "gateway.loaded_p99", "gateway.idle_p99", "<=", 2.0, "x"),
    ("the same <= 2x the p99 with the senders at a stand-in server (their CPU alone)",
     "gateway.loaded_p99", "gateway.control_p99", "<=", 2.0, "x"),
    ("a 16 MB body without the token: its 401 < 50 ms", "gateway.refused_ms", None, "<",
     50.0, "ms"),
    ("the same: the gateway's RSS grows < 10 MiB", "gateway.grew_mib", None, "<", 10.0,
     "MiB"),
]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss_mib(pid: int) -> float:
    found = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(),
                      re.MULTILINE)
    if found is None:
        raise BenchError("no VmRSS for the gateway")
    return int(found.group(1)) / 1024


def _serve(b: Bench, port: int) -> subprocess.Popen[bytes]:
    env = {**b.env(), "STREAM_JOBS_GATEWAY_TOKEN": TOKEN}
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("stream-jobs")), "serve", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"], env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise BenchError("`stream-jobs serve` did not start")
        time.sleep(0.1)  # a poll interval


def gateway(b: Bench) -> None:
    run_async(b.declare(JOB_TYPE, partitions=1), 60)
    n = b.scale.awaited_n
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    body = big_body()
    idle: list[float] = []
    loaded: list[float] = []
    control: list[float] = []
    stand_in_port = _free_port()
    stand_in = subprocess.Popen([sys.executable, "-m", "ops.bench.hostile", "--stand-in",
                                 str(stand_in_port)], env=b.env())
    refused: list[float] = []
    grew: list[float] = []
    loads: list[float] = []
    process = _serve(b, port)
    try:
        enqueue_latencies(url, TOKEN, 50)  # warm: the producer, the connection
        for run in range(b.scale.runs):
            idle.append(percentile(enqueue_latencies(url, TOKEN, n), 99) * 1000)
            for target in rotated(["gateway", "stand-in"], run):
                aimed = port if target == "gateway" else stand_in_port
                p99 = _under_senders(b, url, aimed, n)
                (loaded if target == "gateway" else control).append(p99)
            before = _rss_mib(process.pid)
            took, line = unauthenticated_post(port, body)
            if not line.startswith(b"HTTP/1.1 401"):
                raise BenchError(f"a body without the token was answered {line!r}")
            refused.append(took * 1000)
            grew.append(_rss_mib(process.pid) - before)
            loads.append(os.getloadavg()[0])
            print(f"[bench] gateway run {run + 1}: enqueue p99 idle {idle[-1]:.1f} ms, "
                  f"under {SENDERS} senders {loaded[-1]:.1f} ms (at the stand-in "
                  f"{control[-1]:.1f} ms); 401 after {refused[-1]:.1f} ms; load "
                  f"{loads[-1]:.1f}", flush=True)
    finally:
        for server in (process, stand_in):
            server.terminate()
            server.wait(timeout=30)
    r = b.results
    note = (f"{n:,} awaited single-job POSTs on one keep-alive connection; 1-min load "
            f"{min(loads):.1f} - {max(loads):.1f} on {os.cpu_count()} cores")
    r.add("gateway.idle_p99", "enqueue through the gateway, idle: p99", "ms", idle, note)
    r.add("gateway.loaded_p99", f"the same, {SENDERS} clients without the token sending "
          "16 MB bodies meanwhile: p99", "ms", loaded, note)
    r.add("gateway.control_p99", f"the same, the {SENDERS} senders aimed at a stand-in server "
          "instead (the control)", "ms", control, note)
    r.add("gateway.refused_ms", "a 16 MB body without the token: until its 401", "ms",
          refused, "one connection, the body sent while the answer is read")
    r.add("gateway.grew_mib", "the same: the gateway's RSS growth", "MiB", grew)


def _under_senders(b: Bench, url: str, port: int, n: int) -> float:
    """An enqueue's p99 (ms) while SENDERS processes send the 16 MB body to `port`."""
    senders = [subprocess.Popen([sys.executable, "-m", "ops.bench.hostile", str(port)],
                                env=b.env()) for _ in range(SENDERS)]
    try:
        return percentile(enqueue_latencies(url, TOKEN, n), 99) * 1000
    finally:
        for sender in senders:
            sender.kill()
            sender.wait()


RATIOS = [
    ("enqueue p99 under three senders without the token / idle", "gateway.loaded_p99",
     "gateway.idle_p99"),
    ("the same / the senders at the stand-in (the gateway's own share)",
     "gateway.loaded_p99", "gateway.control_p99"),
    ("senders at the stand-in / idle (the machine's share)", "gateway.control_p99",
     "gateway.idle_p99"),
]

__all__ = ["GOALS", "HEADING", "INTRO", "PREFIX", "RATIOS", "gateway"]
