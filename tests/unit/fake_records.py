"""A consumed record without a broker: what `GroupMember.dispatch` is handed by a fetch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class FakeRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int = 0
    key: bytes | None = None
    value: bytes | None = b"{}"
    headers: Sequence[tuple[str, bytes]] = ()
