"""Waiting in tests without sleeping for a guessed time: poll a condition to a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

POLL_S = 0.02


async def until(check: Callable[[], bool | Awaitable[bool]], what: str,
                within_s: float = 30.0) -> float:
    """Poll `check` (sync or async) until it holds; the seconds it took. Fails the test
    with `what` at the deadline."""
    start = time.monotonic()
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > within_s:
            pytest.fail(f"not within {within_s:g} s: {what}")
        await asyncio.sleep(POLL_S)
