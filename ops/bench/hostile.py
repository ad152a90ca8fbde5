"""A client without the gateway's token that sends a 16 MB JSON body, and an authenticated
client that times its enqueues: the probes of the gateway section and of
tests/integration/test_gateway_hostile.py.

`python -m ops.bench.hostile PORT` sends the body in a loop until killed (one sender of
the section's three). `python -m ops.bench.hostile --stand-in PORT` is a server that is
not the gateway: it answers every request 401 from its headers and closes, so senders
aimed at it take the machine's CPU as they do against the gateway, and the gateway does
no work for them (the section's control).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
import time

import httpx

BODY_BYTES = 16_000_000
JOB_TYPE = "email.send"


def big_body(size: int = BODY_BYTES) -> bytes:
    """`[[],[],...]`: cheap to send, costly to parse (the probe of issue 23)."""
    return b"[" + b"[]," * (size // 3 - 1) + b"[]]"


def _head(port: int, body: bytes) -> bytes:
    return (f"POST /jobs/{JOB_TYPE} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()


def unauthenticated_post(port: int, body: bytes) -> tuple[float, bytes]:
    """Send `body` without a token; (seconds until the answer's status line, the line)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        started = time.perf_counter()

        def send() -> None:
            with contextlib.suppress(OSError):  # the gateway may close before the end
                sock.sendall(_head(port, body) + body)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        line = sock.makefile("rb").readline()
        took = time.perf_counter() - started
    sender.join(timeout=30)
    return took, line


def enqueue_latencies(url: str, token: str, count: int) -> list[float]:
    """`count` awaited enqueues, one after another on one connection: each one's seconds."""
    times = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as http:
        for n in range(count):
            started = time.perf_counter()
            answer = http.post(f"/jobs/{JOB_TYPE}",
                               json={"payload": {"to": "a@b.c", "subject": str(n)}})
            times.append(time.perf_counter() - started)
            if answer.status_code != 202:
                raise AssertionError(f"enqueue answered {answer.status_code}: {answer.text}")
    return times


async def _stand_in(port: int) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError,
                                 asyncio.LimitOverrunError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    if sys.argv[1] == "--stand-in":
        asyncio.run(_stand_in(int(sys.argv[2])))
        return
    port = int(sys.argv[1])
    body = big_body()
    head = _head(port, body)
    while True:
        with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head + body)
            sock.recv(100)


if __name__ == "__main__":
    main()
