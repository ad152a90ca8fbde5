"""`stream-jobs job --key K --type T`: the jobs of a type whose records carry a Kafka key."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

import orjson
from rich.console import Console

from stream_jobs.cli.tables import (
    FittedTable,
    job_id_column,
    number_column,
    print_table,
    text_column,
    word_column,
)
from stream_jobs.errors import ConfigError
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.lookup.by_key import MAX_KEY_BYTES, KeyMatches, find_by_key
from stream_jobs.settings import Settings

console = Console()
status_console = Console(stderr=True)


def checked_key(key: str) -> str:
    """`key`, or a ConfigError saying what a key may be."""
    if not key or len(key.encode()) > MAX_KEY_BYTES:
        raise ConfigError(f"A key to look for has 1 to {MAX_KEY_BYTES:,} bytes; "
                          f"this one has {len(key.encode()):,}.")
    return key


def print_key_search(settings: Settings, policy: JobTypePolicy, key: str, *,
                     max_records: int, as_json: bool, wide: bool) -> None:
    """Find and print the jobs of `policy`'s type with `key`: a table that fits 80
    columns (`wide`: with the first record's time and the latest record's topic), or
    one JSON document."""
    key = checked_key(key)

    async def run() -> KeyMatches:
        return await find_by_key(settings, policy, key, max_records_per_topic=max_records)

    if as_json:
        sys.stdout.write(orjson.dumps(asyncio.run(run()).to_dict(),
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    with status_console.status(f"looking for key {key!r} in {policy.job_type}"):
        found = asyncio.run(run())
    console.print(found.summary()[:1].upper() + found.summary()[1:], highlight=False,
                  soft_wrap=True)
    if not found.jobs:
        return
    table = FittedTable(_KEYED_COLUMNS, wide=wide)
    for job in found.jobs:
        table.add_row(job.job_id, _when(job.first_ms), _when(job.latest_ms), str(job.records),
                      job.latest_topic)
    print_table(console, table, wide=wide)
    console.print(f"[dim]`stream-jobs job ID --type {policy.job_type}` tells what "
                  "happened to one of them.[/]", highlight=False, soft_wrap=True)


# At 80 columns: the job ID whole, its latest record's time and the records seen; --wide
# adds its first record's time and the latest record's topic.
_KEYED_COLUMNS = (job_id_column(), word_column("first (UTC)", wide=True),
                  word_column("latest (UTC)"), number_column("recs"),
                  text_column("latest topic", wide=True))


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


__all__ = ["checked_key", "print_key_search"]
