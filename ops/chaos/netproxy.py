"""Toxiproxy (Shopify's TCP fault proxy) between the parts: the network faults of `make
chaos` and of tests/integration/test_network_faults.py.

`ops/toxiproxy/build.sh` builds the server at a pinned version into the stack's folder;
`NetProxy` runs one server on a loopback API port and makes its links: a `Link` listens on
a port of its own and forwards to its upstream (a broker's FRONT listener, which tells its
clients the proxies' ports for every broker, or Postgres), and takes faults ("toxics"):
latency with jitter, a blackhole (bytes go nowhere, no RST; the link's connections are
closed when it ends, as Toxiproxy cannot pass the rest of a stream it dropped a part of),
a bandwidth squeeze, or resets (RST) of every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster

HOST = "127.0.0.1"
BUILD = Path(__file__).resolve().parents[1] / "toxiproxy" / "build.sh"
READY_WITHIN_S = 20.0


class NetProxyError(Exception):
    """Toxiproxy could not be built, started, or did not do what it was asked."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def server_binary(stack_dir: Path) -> Path:
    """The Toxiproxy server, built once per machine by ops/toxiproxy/build.sh."""
    env = {**os.environ, "STREAM_JOBS_STACK_DIR": str(stack_dir)}
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, check=False,
                          env=env)
    if done.returncode != 0:
        raise NetProxyError(f"building Toxiproxy failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class Link:
    """One proxy: `listen` forwards to `upstream` until a toxic says otherwise."""

    proxy: NetProxy
    name: str
    listen: int
    upstream: str
    toxics: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.listen}"

    async def add(self, kind: str, stream: str = "downstream", **attributes: Any) -> str:
        name = f"{kind}-{stream}-{len(self.toxics)}"
        await self.proxy.call("POST", f"/proxies/{self.name}/toxics", {
            "name": name, "type": kind, "stream": stream, "toxicity": 1.0,
            "attributes": attributes})
        self.toxics.append(name)
        return name

    async def clear(self) -> None:
        """Every toxic of the link removed: it forwards again."""
        while self.toxics:
            name = self.toxics.pop()
            await self.proxy.call("DELETE", f"/proxies/{self.name}/toxics/{name}")

    async def latency(self, ms: int, jitter_ms: int = 0) -> None:
        """`ms` ± `jitter_ms` on the way back (a request's answer waits that long)."""
        await self.add("latency", "downstream", latency=ms, jitter=jitter_ms)

    async def blackhole(self) -> None:
        """Bytes in both directions go nowhere; connections stay open; new ones are
        accepted and hear nothing."""
        await self.add("timeout", "upstream", timeout=0)
        await self.add("timeout", "downstream", timeout=0)

    async def bandwidth(self, kb_per_s: int) -> None:
        await self.add("bandwidth", "downstream", rate=kb_per_s)

    async def reset_connections(self) -> None:
        """RST every connection of the link now (and any made while the toxic stays)."""
        await self.add("reset_peer", "upstream", timeout=0)

    async def disable(self) -> None:
        """The link closes its connections and refuses new ones (`enable` reopens it)."""
        await self.proxy.call("POST", f"/proxies/{self.name}", {"enabled": False})

    async def enable(self) -> None:
        await self.proxy.call("POST", f"/proxies/{self.name}", {"enabled": True})

    @contextlib.asynccontextmanager
    async def faulted(self, fault: str, **attributes: Any) -> AsyncIterator[None]:
        """`async with link.faulted("blackhole"):` the fault while the block runs."""
        await getattr(self, fault)(**attributes)
        try:
            yield
        finally:
            await self.clear()


@dataclass
class NetProxy:
    """One Toxiproxy server, its API on `api_port`, logging to `folder`."""

    stack_dir: Path
    folder: Path
    api_port: int = field(default_factory=free_port)
    links: dict[str, Link] = field(default_factory=dict)
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def api(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    async def start(self) -> NetProxy:
        binary = await asyncio.to_thread(server_binary, self.stack_dir)
        self._spawn(binary)
        assert self._proc is not None
        deadline = time.monotonic() + READY_WITHIN_S
        while True:
            with contextlib.suppress(httpx.HTTPError):
                await self.call("GET", "/version")
                return self
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise NetProxyError(f"Toxiproxy did not answer on {self.api} "
                                    f"(see {self.folder / 'toxiproxy.log'})")
            await asyncio.sleep(0.1)

    def _spawn(self, binary: Path) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / "toxiproxy.log").open("ab") as out:
            self._proc = subprocess.Popen(
                [str(binary), "-host", HOST, "-port", str(self.api_port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            if self._proc.poll() is None:
                self._proc.kill()
        self._proc = None

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.request(method, self.api + path, json=body)
        if answer.status_code >= 400:
            raise NetProxyError(f"Toxiproxy {method} {path}: {answer.status_code} "
                                f"{answer.text.strip()}")
        is_json = answer.headers.get("content-type", "").startswith("application/json")
        return answer.json() if is_json and answer.content else answer.text

    async def link(self, name: str, upstream: str, listen: int | None = None) -> Link:
        port = listen if listen is not None else free_port()
        await self.call("POST", "/proxies", {"name": name, "listen": f"{HOST}:{port}",
                                             "upstream": upstream, "enabled": True})
        found = self.links[name] = Link(self, name, port, upstream)
        return found

    async def heal(self) -> None:
        """Every toxic removed and every link enabled."""
        await self.call("POST", "/reset")
        for link in self.links.values():
            link.toxics.clear()


@dataclass(frozen=True)
class Fronted:
    """The links in front of a stack: one per broker, and Postgres twice (one for the
    workers' pools, one for their LISTEN connections), and the settings that use them."""

    brokers: list[Link]
    postgres: Link
    listen: Link
    settings: Settings  # kafka_bootstrap, database_url, database_listen_url through them


async def front(proxy: NetProxy, settings: Settings, cluster: KafkaCluster) -> Fronted:
    """Put `proxy` between the settings' users and `cluster` and Postgres."""
    brokers = [await proxy.link(f"kafka{node.node_id}", f"{HOST}:{node.front_port}",
                                listen=node.front_proxy_port) for node in cluster.nodes]
    upstream = f"{HOST}:{settings.dev_postgres_port}"
    postgres = await proxy.link("postgres", upstream)
    listen = await proxy.link("postgres-listen", upstream)
    dsn = settings.database_url
    via = {"kafka_bootstrap": ",".join(b.address for b in brokers),
           "database_url": _with_port(dsn, postgres.listen),
           "database_listen_url": _with_port(dsn, listen.listen)}
    return Fronted(brokers, postgres, listen, settings.model_copy(update=via))


def _with_port(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{user}{HOST}:{port}"))


__all__ = [
    "Fronted",
    "Link",
    "NetProxy",
    "NetProxyError",
    "free_port",
    "front",
    "server_binary",
]
