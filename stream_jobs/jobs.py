"""A job to enqueue, as `enqueue_many` takes it (and the scheduler's firings are made).

`JobClient` checks and sends it (`stream_jobs.client`); this module only says what it is,
so that the features below the client (the scheduler) can make one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

Seconds = float | int | timedelta


@dataclass(frozen=True)
class Job:
    """One job for `enqueue_many`; the fields mean what `enqueue`'s arguments mean."""

    job_type: str
    payload: BaseModel | Mapping[str, Any]
    key: str | bytes | None = None
    job_id: str | None = None
    priority: str = "default"
    delay: Seconds | None = None
    run_at: datetime | None = None
    expires_in: Seconds | None = None
    tenant: str | None = None
