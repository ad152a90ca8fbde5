"""A run's own corner of the shared stack: a topic prefix and Postgres schema no other run
uses (`stream_jobs.testing.stack`'s, as the tests get theirs), a folder for its topics/
and logs, and, once the run was clean, nothing left behind (a failed run's are kept)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from stream_jobs.kafka.admin import admin_client
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import drop_schema, fresh_prefix


def fresh_settings(base: Settings, out_dir: Path, label: str,
                   **update: object) -> tuple[Settings, Path]:
    """`base` on a fresh prefix (topics, groups) and schema of the same name, with its
    topics folder in the run's own folder `out_dir/<label>-<prefix>`; and that folder."""
    prefix = fresh_prefix()
    folder = out_dir / f"{label}-{prefix}"
    topics = folder / "topics"
    topics.mkdir(parents=True)
    settings = base.model_copy(update={"topic_prefix": prefix, "database_schema": prefix,
                                       "topics_dir": topics, **update})
    return settings, folder


async def settle(settings: Settings, folder: Path, problems: Sequence[str]) -> None:
    """After a run: a clean one leaves nothing behind; a failed one keeps its topics and
    schema, and its problems in `folder/problems.txt`, for a look."""
    if problems:
        (folder / "problems.txt").write_text("\n".join(problems) + "\n")
    else:
        await leave_nothing(settings)


async def leave_nothing(settings: Settings) -> None:
    """Delete every topic of the run's prefix (its types', and the `_stats` and `_control`
    topics its workers made) and drop its schema. Best effort: what is left is a
    leftover, not a verdict."""
    ours = f"{settings.topic_prefix}."
    with contextlib.suppress(Exception):
        async with admin_client(settings) as admin:
            await admin.delete_topics([t for t in await admin.list_topics()
                                       if t.startswith(ours)])
    with contextlib.suppress(Exception):
        await drop_schema(settings)
