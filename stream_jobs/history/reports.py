"""What the history reads of a worker's report: who sent it, when, and its slots. Pure.

Workers write their reports (`stream_jobs.runtime.reports.WorkerReport`, which lies above
this folder); the history reads only these fields of the JSON, so either side can add
fields. tests/unit/test_history_windows.py checks a `WorkerReport` reads back here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from stream_jobs.history.tally import Tally


@dataclass(frozen=True)
class ReportSlots:
    """One worker report's slots: its tallies by slot start (ms), cumulative within each."""

    job_type: str
    worker_id: str
    at_ms: int
    slot_ms: int
    slots: dict[int, Tally]
    final: bool = False

    @classmethod
    def from_json(cls, raw: bytes | None) -> ReportSlots | None:
        """The slots of the report in `raw`; None for anything else (a shadow's report, a
        report of a worker from before history, not JSON). A slot that is not a tally
        makes the whole report unreadable: counting part of it would be counting wrong."""
        try:
            data: Any = orjson.loads(raw or b"")
            if not isinstance(data, dict) or data.get("shadow") or not data.get("slot_ms"):
                return None
            return cls(job_type=str(data["job_type"]), worker_id=str(data["worker_id"]),
                       at_ms=int(data["at_ms"]), slot_ms=int(data["slot_ms"]),
                       slots={int(start): Tally.from_obj(obj)
                              for start, obj in dict(data.get("slots", {})).items()},
                       final=bool(data.get("final", False)))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


__all__ = ["ReportSlots"]
