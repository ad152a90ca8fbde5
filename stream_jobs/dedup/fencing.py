"""Fencing tokens: a number per delivery that only grows, for effects outside Postgres.

A token is a `nextval` of one Postgres sequence in the dedup database
(`stream_jobs_fencing_tokens`, made by `stream-jobs db migrate`), so a token is larger
than every token handed out before it was asked for, whatever the delivery: a retry
through the tiers, a DLQ requeue (attempts reset or not), a replay with the same job ID, a
redelivery of the same offset after a rebalance or a restart. A store that keeps the
highest token it accepted and refuses a write whose token is below it never lets a
superseded delivery's late write land (equal is the same run: no two runs share a
token). docs/fencing.md has the pattern, and why the token does not come from Kafka's
group generation and offsets.

`TokenIssuer` is the coordination, with no I/O of its own: a request that finds no fetch
in flight starts one at once, and the requests that arrive meanwhile go together in the
next fetch, one round trip for all of them (`SELECT nextval(...) FROM generate_series`).
So every token is taken after its request was made, which is the order fencing needs.
`FencingToken` is what `ctx.fencing_token` returns: one token per delivery, asked for on
its first await. A plain `def` handler's `ctx.fencing_token_sync()` awaits the same one on
the worker's loop from the handler's thread (`stream_jobs.context`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

# `fetch(n)`: n values of the sequence, each taken during the call, in any order.
FetchTokens = Callable[[int], Awaitable[Sequence[int]]]

# Tokens fetched in one round trip at most; more requests wait for the next one.
BATCH_MAX = 1000


class TokenIssuer:
    """Hands out tokens from `fetch`, with at most one fetch in flight (see the module
    docstring). A fetch that fails fails the requests it was for; the next request
    starts a new one."""

    def __init__(self, fetch: FetchTokens, *, batch_max: int = BATCH_MAX) -> None:
        if batch_max < 1:
            raise ValueError("batch_max must be at least 1")
        self._fetch = fetch
        self._batch_max = batch_max
        self._waiting: list[asyncio.Future[int]] = []
        self._serving: asyncio.Task[None] | None = None
        self.fetches = 0  # round trips made, for tests and the bench

    def request(self) -> asyncio.Future[int]:
        """A future for a token taken after this call."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        if self._serving is None:
            # Started on the loop's next turn: the requests made in this one join it.
            self._serving = asyncio.create_task(self._serve())
        return future

    async def _serve(self) -> None:
        try:
            while self._waiting:
                batch = [f for f in self._waiting[:self._batch_max] if not f.done()]
                del self._waiting[:self._batch_max]
                if batch:
                    await self._fill(batch)
        finally:
            self._serving = None

    async def _fill(self, batch: list[asyncio.Future[int]]) -> None:
        self.fetches += 1
        try:
            tokens = sorted(await self._fetch(len(batch)))
            if len(tokens) != len(batch):
                raise RuntimeError(f"asked for {len(batch)} fencing tokens, got {len(tokens)}")
        except Exception as exc:
            for future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for future in batch:
                future.cancel()
            raise
        # The earliest request gets the lowest: not needed for fencing (they were all
        # waiting together), but it keeps tokens in request order within a process.
        for future, token in zip(batch, tokens, strict=True):
            if not future.done():
                future.set_result(token)

    async def close(self) -> None:
        """Stop serving: requests still waiting are cancelled."""
        for future in self._waiting:
            future.cancel()
        self._waiting.clear()
        if self._serving is not None:
            self._serving.cancel()
            await asyncio.gather(self._serving, return_exceptions=True)


class FencingToken:
    """`await ctx.fencing_token`: the delivery's token, requested on the first await and
    the same on every later one; awaits that overlap share the one request. If getting it
    failed (Postgres down), the next await asks again."""

    __slots__ = ("_future", "_request")

    def __init__(self, request: Callable[[], asyncio.Future[int]]) -> None:
        self._request = request
        self._future: asyncio.Future[int] | None = None

    @property
    def asked(self) -> bool:
        """Whether the token was asked for and that did not fail (it is on its way, or
        taken): an await now makes no new request."""
        future = self._future
        return future is not None and not (future.done() and (future.cancelled()
                                                              or future.exception() is not None))

    def __await__(self) -> Generator[Any, None, int]:
        future = self._future
        if future is None or not self.asked:
            future = self._future = self._request()
        # Shielded: one awaiter cancelled (its timeout) does not fail another's await of
        # the same token, nor waste the request.
        return asyncio.shield(future).__await__()
