"""Pacing a requeue: how many letters go per send-and-commit, and a token pacer that keeps
a `--rate` on average. Small and pure but for the pacer's sleep."""

from __future__ import annotations

import asyncio
import time

CHUNK = 500  # letters per fetch, send and commit when no rate is given


class Pacer:
    """Token pacing: `take(n)` returns when n more sends keep the average at the rate."""

    def __init__(self, rate_per_s: float) -> None:
        self.interval_s = 1.0 / rate_per_s
        self._next = time.monotonic()

    async def take(self, n: int) -> None:
        now = time.monotonic()
        if self._next > now:
            await asyncio.sleep(self._next - now)  # pacing, not waiting for a condition
        self._next = max(self._next, now) + n * self.interval_s


def chunk_size(rate_per_s: float | None) -> int:
    """Letters per send-and-commit: large when unpaced, ~0.2 s worth when paced, so an
    interrupted paced run re-sends little."""
    if rate_per_s is None:
        return CHUNK
    return max(1, min(CHUNK, int(rate_per_s * 0.2)))


__all__ = ["CHUNK", "Pacer", "chunk_size"]
