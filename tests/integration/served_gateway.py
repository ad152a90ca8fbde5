"""`stream-jobs serve` in a process of its own on a free loopback port, for the tests that
need the gateway as a user runs it (uvicorn, its own memory, its own log)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from stream_jobs.settings import Settings

POLL_S = 0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def serve_env(settings: Settings, topics_dir: Path, **more: str) -> dict[str, str]:
    """The environment of a gateway on `settings`' prefix, schema and `topics_dir`."""
    return {**os.environ, "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "STREAM_JOBS_DATABASE_URL": settings.database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": settings.database_schema,
            "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
            "STREAM_JOBS_TOPICS_DIR": str(topics_dir), **more}


@contextlib.contextmanager
def serving(env: Mapping[str, str], log: Path, *flags: str
            ) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """(port, process) of a `stream-jobs serve` answering /healthz; stopped afterwards."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("stream-jobs")), "serve", "--host",
             "127.0.0.1", "--port", str(port), "--log-level", "warning", *flags],
            env=dict(env), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not answers(f"http://127.0.0.1:{port}/healthz"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"`stream-jobs serve` did not start:\n{log.read_text()}")
            time.sleep(POLL_S)  # a poll interval, not a wait for an outcome
        yield port, process
    finally:
        process.terminate()
        process.wait(timeout=30)
