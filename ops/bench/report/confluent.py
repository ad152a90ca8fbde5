"""`## A second Kafka client` in RESULTS.md: confluent-kafka's consume loops beside
aiokafka's, and the prototype of our dispatch on it beside ours (ops/bench/confluent.py),
with the issue's 1.5x question answered from the ratios. Pure:
`confluent_section(details, figures) -> lines`."""

from __future__ import annotations

from typing import Any

from ops.bench import confluent as confluent_bench
from ops.bench.report.tables import (
    RATIO_COLUMNS,
    FigureJSON,
    figures_table,
    fmt,
    ratio_of,
    ratio_rows,
    table,
)

PROTOTYPE = "confluent.noop_key"
OURS = "confluent.ref_ours"
PROTOTYPE_ON_AIOKAFKA = "confluent.proto_aiokafka"


def proposal(figures: dict[str, FigureJSON]) -> str:
    """The issue's question ("if the prototype is >= 1.5x ours, propose a transport
    option") answered from this run's figures, with where the difference comes from.
    Informational: not a goal."""
    if PROTOTYPE not in figures or OURS not in figures:
        return "The prototype or ours was not measured: the issue's question is open."
    value, low, high, _ = ratio_of(figures, PROTOTYPE, OURS)
    at = confluent_bench.PROPOSE_AT
    verdict = (f"at or above the issue's {at:g}x: the case for a transport option is made"
               if value >= at else
               f"under the issue's {at:g}x: no case for a transport option from this run")
    text = (f"**Prototype on confluent-kafka / ours: {value:.2f}x** (spread {low:.2f}x - "
            f"{high:.2f}x), {verdict}.")
    if PROTOTYPE_ON_AIOKAFKA in figures:
        client = ratio_of(figures, PROTOTYPE, PROTOTYPE_ON_AIOKAFKA)[0]
        worker = ratio_of(figures, PROTOTYPE_ON_AIOKAFKA, OURS)[0]
        text += (f" Of that, the client's part (the prototype on confluent-kafka / on "
                 f"aiokafka) is {client:.2f}x and the part of what the prototype leaves out "
                 f"of the worker (the prototype on aiokafka / ours) {worker:.2f}x: only the "
                 "first is what a transport option would bring.")
    return text


def _run_rows(details: dict[str, Any]) -> list[list[str]]:
    labels = {kind: label for kind, _, label in confluent_bench.CONTENDERS}
    return [[str(row["run"]), labels.get(row["contender"], row["contender"]),
             fmt(row["rate"]), f"{row['load_avg_after']:.1f}"]
            for row in details.get("runs", [])]


def confluent_section(details: dict[str, Any], figures: dict[str, FigureJSON],
                      error: str | None = None) -> list[str]:
    """`## A second Kafka client`: the question, the ratios, the figures and the runs."""
    quick = " (BENCH_QUICK smoke run: not for quoting)" if details.get("quick") else ""
    versions = details.get("versions", {})
    out = [f"## {confluent_bench.HEADING}", ""]
    out.append(
        f"Measured on {details.get('measured_at')}{quick} in "
        f"{details.get('took_s', 0):.0f} s on {details.get('nproc')} cores; the "
        f"1-minute load average went from {details.get('load_avg_before', 0):.1f} to "
        f"{details.get('load_avg_after', 0):.1f}. confluent-kafka "
        f"{versions.get('confluent-kafka', '?')} (librdkafka "
        f"{versions.get('librdkafka', '?')}). Every contender drains the same backlog of "
        f"{details.get('jobs', 0):,} of our job records (filled with `enqueue_many`: our "
        "value, key and headers), in an order rotated from run to run; rates run from the "
        "first record or handler call to the last. The prototype is our dispatch "
        "(Dispatcher, OffsetTracker, decode_record, a no-op handler with ordering=key and "
        "concurrency 64, commits of the lowest unfinished offsets every 0.5 s) without "
        "the worker around it; ops/bench/confluent.py says what it leaves out.")
    out += ["", proposal(figures), ""]
    rows = ratio_rows(figures, confluent_bench.RATIOS)
    if rows:
        out += [table(RATIO_COLUMNS, rows), ""]
    mine = [f for name, f in figures.items() if name.startswith(confluent_bench.PREFIX)]
    if mine:
        out += [figures_table(mine), ""]
    if details.get("runs"):
        out += [table(["run", "contender", "rate", "load avg after"], _run_rows(details)), ""]
    if details.get("aio_error"):
        out += [f"**confluent-kafka's AIOConsumer did not work here**: "
                f"{details['aio_error']}. It was left out of the later runs.", ""]
    if error:
        out += [f"**The confluent run failed**: {error}. The tables hold what was measured "
                "before it failed.", ""]
    return out
