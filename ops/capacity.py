"""How many partitions, brokers, disks and worker processes a load needs, and what breaks
first. The arithmetic is `stream_jobs.capacity`; docs/capacity.md explains it.

    .venv/bin/python ops/capacity.py --jobs-per-day 50M --peak 1750
    .venv/bin/python ops/capacity.py --jobs-per-day 1.4B --peak 33000 --job-size 2KB \\
        --noop-per-process 5000 --once-per-process 1500     # use your `make bench` figures

Counts take k, M and B (thousand, million, billion); sizes B, KB, MB, GB, TB (decimal);
durations 10m, 2h, 7d. `--json` prints the plan as one JSON document.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from stream_jobs.capacity import Inputs, Plan, plan
from stream_jobs.durations import format_duration, parse_duration
from stream_jobs.errors import ConfigError

_COUNT = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9}
_SIZE = {"b": 1.0, "": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}


def count(text: str) -> float:
    match = re.fullmatch(r"\s*([\d.]+(?:e\d+)?)\s*([kmb]?)\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (e.g. 50M, 1.4B, 33000)")
    return float(match.group(1)) * _COUNT[match.group(2).lower()]


def size(text: str) -> float:
    match = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?b?)\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 2KB, 8TB)")
    return float(match.group(1)) * _SIZE[match.group(2).lower()]


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parser() -> argparse.ArgumentParser:
    d = Inputs(jobs_per_day=1)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    load = p.add_argument_group("the load")
    load.add_argument("--jobs-per-day", type=count, required=True)
    load.add_argument("--peak", type=count, dest="peak_per_s",
                      help="peak jobs/s (default: --peak-factor x the average)")
    load.add_argument("--peak-factor", type=float, default=d.peak_factor)
    load.add_argument("--job-size", type=size, dest="job_bytes", default=d.job_bytes,
                      help="bytes of a record as stored: payload, key and headers")
    load.add_argument("--retention", type=duration, dest="retention_s", default=d.retention_s,
                      help="how long the lanes keep jobs")
    load.add_argument("--outage", type=duration, dest="outage_s", default=d.outage_s,
                      help="workers down at peak for this long")
    load.add_argument("--catch-up", type=duration, dest="catch_up_s", default=d.catch_up_s,
                      help="drain the outage backlog within this, while the peak goes on")
    load.add_argument("--once-fraction", type=float, default=d.once_fraction,
                      help="share of jobs written through ctx.once()")
    load.add_argument("--retry-fraction", type=float, default=d.retry_fraction,
                      help="share of jobs that fail once and pass through a delay tier")
    work = p.add_argument_group("measured throughput (INPUTS: replace with `make bench`)")
    work.add_argument("--noop-per-process", type=count, default=d.noop_per_process,
                      help="jobs/s one worker process runs with a no-op handler")
    work.add_argument("--once-per-process", type=count, default=d.once_per_process,
                      help="jobs/s one worker process runs through ctx.once()")
    work.add_argument("--spare-processes", type=int, default=d.spare_processes)
    work.add_argument("--partition-growth", type=float, default=d.partition_growth,
                      help="partitions for this many times the processes needed today")
    kafka = p.add_argument_group("kafka")
    kafka.add_argument("--replication-factor", type=int, default=d.replication_factor)
    kafka.add_argument("--disk-per-broker", type=size, dest="disk_per_broker_bytes",
                       default=d.disk_per_broker_bytes)
    kafka.add_argument("--disk-fill", type=float, default=d.disk_fill,
                       help="fill broker disks to this share at most")
    kafka.add_argument("--broker-write", type=size, dest="broker_write_bytes_per_s",
                       default=d.broker_write_bytes_per_s,
                       help="bytes/s one broker writes (leader and follower copies)")
    kafka.add_argument("--partition-write", type=size, dest="partition_write_bytes_per_s",
                       default=d.partition_write_bytes_per_s)
    pg = p.add_argument_group("postgres (the dedup table)")
    pg.add_argument("--dedup-keep", type=duration, dest="dedup_keep_s",
                    help="how long dedup rows are kept (default: --retention)")
    pg.add_argument("--dedup-row-size", type=size, dest="dedup_row_bytes",
                    default=d.dedup_row_bytes)
    pg.add_argument("--dedup-linger-ms", type=float, default=d.dedup_linger_ms)
    pg.add_argument("--dedup-batch-max", type=int, default=d.dedup_batch_max)
    pg.add_argument("--prune", choices=["partitions", "delete"], default=d.prune,
                    help="drop time partitions, or DELETE rows with `stream-jobs db prune`")
    pg.add_argument("--pg-rows-per-s", type=count, default=d.pg_rows_per_s,
                    help="dedup rows one Postgres primary writes per second")
    pg.add_argument("--pg-commits-per-s", type=count, default=d.pg_commits_per_s)
    pg.add_argument("--pg-disk", type=size, dest="pg_disk_bytes", default=d.pg_disk_bytes)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def inputs_of(args: argparse.Namespace) -> Inputs:
    names = {f.name for f in fields(Inputs)}
    return Inputs(**{k: v for k, v in vars(args).items() if k in names})


def dur(seconds: float) -> str:
    """Whole days as days ("7d", not "1w"), anything else as stream-jobs spells it."""
    days = seconds / 86_400
    return f"{days:g}d" if days >= 1 and days == int(days) else format_duration(seconds)


def n(value: float) -> str:
    return f"{value:,.0f}"


def procs(count: int) -> str:
    return f"{count:>14} process" + ("" if count == 1 else "es")


def approx(value: float) -> str:
    """A count to three figures in words: 677 million, 1.06 billion."""
    for word, scale in (("billion", 1e9), ("million", 1e6)):
        if value >= scale:
            return f"{value / scale:.3g} {word}"
    return n(value)


def b(value: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,.0f} B"


def report(p: Plan) -> str:
    i = p.inputs
    rf = i.replication_factor
    lines = [
        f"load: {n(i.jobs_per_day)} jobs/day, {b(i.job_bytes)}/job, retention "
        f"{dur(i.retention_s)}, replication {rf}",
        f"per process (INPUTS, replace with `make bench`): no-op {n(i.noop_per_process)}/s, "
        f"exactly-once {n(i.once_per_process)}/s",
        f"{i.once_fraction:.0%} of jobs use ctx.once(): {n(p.per_process)} jobs/s per process",
        "",
        "rates",
        f"  average            {n(p.average_per_s):>14} jobs/s  "
        f"{b(p.average_per_s * i.job_bytes)}/s",
        f"  peak               {n(p.peak_per_s):>14} jobs/s  {b(p.peak_bytes_per_s)}/s",
        f"  outage backlog     {n(p.backlog_jobs):>14} jobs    {b(p.backlog_bytes)} "
        f"({dur(i.outage_s)} at peak; {b(p.backlog_bytes * rf)} with replicas)",
        f"  catch-up           {n(p.catch_up_per_s):>14} jobs/s  peak + the backlog within "
        f"{dur(i.catch_up_s)}",
        "",
        "workers (one type)",
        f"  at peak, no-op     {procs(p.processes_noop_peak)}",
        f"  at peak, once()    {procs(p.processes_once_peak)}",
        f"  for the catch-up   {procs(p.processes_catch_up)} (the mix)",
        f"  to run             {procs(p.processes)} (+{i.spare_processes} spare)",
        f"  partitions         {p.partitions:>14} per lane (processes x {i.partition_growth:g}, "
        "rounded up)",
        "",
        "kafka",
        f"  retained           {b(p.retained_bytes):>14}  average x retention, "
        f"+{i.retry_fraction:.0%} retries",
        f"  segment slack      {b(p.segment_slack_bytes):>14}  a 1 GiB segment per partition",
        f"  disk, all replicas {b(p.disk_bytes):>14}  x{rf} replicas, at {i.disk_fill:.0%} full",
        f"  brokers            {p.brokers:>14}  the most of: disk {p.brokers_for_disk}, "
        f"peak writes {p.brokers_for_writes}, replication {rf}",
        f"                                    (a broker: {b(i.disk_per_broker_bytes)} disk, "
        f"{b(i.broker_write_bytes_per_s)}/s writes)",
        f"  retention > outage + catch-up: {'yes' if p.retention_covers_outage else 'NO'}",
        "",
        "postgres (dedup)",
        f"  rows at peak       {n(p.dedup_rows_peak_per_s):>14} rows/s",
        f"  jobs per commit    {p.dedup_batch:>14.1f}  ({i.dedup_linger_ms:g} ms linger, "
        f"{n(p.dedup_rows_peak_per_s / p.processes)} rows/s per process)",
        f"  commits at peak    {n(p.dedup_commits_peak_per_s):>14} commits/s",
        f"  pruning            {n(p.dedup_deletes_per_s):>14} deletes/s  ({i.prune})",
        f"  rows kept          {n(p.dedup_rows_kept):>14}  "
        f"({dur(i.dedup_keep_s or i.retention_s)})",
        f"  table size         {b(p.dedup_table_bytes):>14}  at {b(i.dedup_row_bytes)}/row",
        "",
        "what breaks first (limits that adding brokers or processes does not raise)",
    ]
    ranked = sorted(p.limits, key=lambda limit: limit.utilisation, reverse=True)
    for rank, limit in enumerate(ranked, 1):
        cap = b(limit.capacity) if limit.unit == "bytes" else f"{n(limit.capacity)} {limit.unit}"
        lines.append(f"  {rank}. {limit.name}: {limit.utilisation:.0%} of {cap}")
        lines.append(f"     reached at about {approx(p.breaking_jobs_per_day(limit))} jobs/day")
        lines.append(f"     -> {limit.fix}")
    return "\n".join(lines)


def as_json(p: Plan) -> dict[str, Any]:
    out = asdict(p)
    out["breaks_first"] = p.breaks_first.name
    for limit, raw in zip(p.limits, out["limits"], strict=True):
        raw["utilisation"] = limit.utilisation
        raw["breaking_jobs_per_day"] = p.breaking_jobs_per_day(limit)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        result = plan(inputs_of(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(as_json(result), indent=2) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
