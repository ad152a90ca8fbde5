"""The closing parts of RESULTS.md: the machine, the settings and how each figure is
taken; then the details behind some figures (the profile, an exactly-once job's CPU, the
latency search, the retries, the backlog fills) and the run's own timings."""

from __future__ import annotations

import os
from typing import Any

from ops.bench.report.method import METHOD
from ops.bench.report.tables import table


def setup_sections(meta: dict[str, Any]) -> list[str]:
    """`## Machine and versions`, `## Settings` and `## How each figure is taken`."""
    rows = [[k, str(v)] for k, v in meta.get("machine", {}).items()]
    rows += [[k, str(v)] for k, v in meta.get("versions", {}).items()]
    out = ["## Machine and versions", "", table(["", ""], rows), ""]
    out += ["## Settings", "", table(["", ""], [[k, str(v)] for k, v in
                                                 meta.get("settings", {}).items()]), ""]
    out += ["## How each figure is taken", "", *METHOD, ""]
    return out


def detail_sections(details: dict[str, Any]) -> list[str]:
    """The details of the sections that ran, in this order: profile, exactly-once CPU,
    latency, retry, backlog fills."""
    out = []
    if details.get("profile"):
        out += profile_section(details["profile"])
    if details.get("profile_once"):
        out += profile_section(details["profile_once"], once=True)
    if "once_cpu" in details:
        out += once_cpu_section(details["once_cpu"])
    out += latency_section(details.get("latency_capacity_steps") or [])
    out += retry_section(details.get("retry_runs") or [])
    fills = {k: v for k, v in details.items() if k.endswith("_fill_jobs_per_s")}
    if fills:
        out += ["Backlog fills (enqueue_many, for reference): " + ", ".join(
            f"{k.removesuffix('_fill_jobs_per_s')} {v:,.0f} jobs/s" for k, v in fills.items()),
            ""]
    return out


ONCE_FORMS = {"live": "ctx.once(), concurrency 64",
              "by hand": "a hand-written idempotency key, a transaction per job",
              "deferred": "ctx.once_deferred(), concurrency 64",
              "deferred256": "ctx.once_deferred(), concurrency 256"}


def once_cpu_section(once_cpu: dict[str, Any]) -> list[str]:
    """Where an exactly-once job's CPU goes (the cost behind that goal), per form."""
    out = ["## Where an exactly-once job's CPU goes", "",
           "CPU time per job while each exactly-once drain ran (median of the runs; the "
           "drain call includes start-up and the idle check): this process, which runs "
           "the worker; the broker; Postgres (its server processes, exited backends "
           "included); and the whole machine, which has 2 cores shared by all of them. "
           "1,000 ms divided by the machine's ms per job over its cores bounds the jobs/s "
           "this box could give that form.", ""]
    rows = []
    for name, label in ONCE_FORMS.items():
        if name not in once_cpu:
            continue
        ms = once_cpu[name]["ms_per_job"]
        cores = os.cpu_count() or 1
        rows.append([label, f"{ms['worker']:.3f}", f"{ms['broker']:.3f}",
                     f"{ms['postgres']:.3f}", f"{ms['machine']:.3f}",
                     f"{cores * 1000 / ms['machine']:,.0f}" if ms["machine"] else "-"])
    out.append(table(["form", "worker ms/job", "broker ms/job", "Postgres ms/job",
                       "machine ms/job", "bound on this box (jobs/s)"], rows))
    out.append("")
    return out


def profile_section(profile: dict[str, Any], *, once: bool = False) -> list[str]:
    """The profile of the no-op path, or (`once`) of the live `ctx.once()` path."""
    what = "live ctx.once()" if once else "no-op"
    name = "profile-once" if once else "profile"
    out = [f"## Profile of the {what} processing path", ""]
    out.append(f"pyinstrument, 1 ms sampling of the whole thread (event loop included), while "
               f"one worker drained {profile['jobs']:,} {what} jobs (ordering=key"
               f"{', one effect row each' if once else ''}): "
               f"{profile['duration_s']:.1f} s wall, {profile['cpu_s']:.1f} s CPU, "
               f"{profile['rate_under_profiler']:,.0f} jobs/s under the profiler. Sampling "
               "runs from the first job to the last (start-up and the idle check are not in "
               "it). Time inside the event loop's C code (uvloop), waiting for the network "
               "included, shows as its own row. Full tree: "
               f"`ops/bench/out/run-*/{name}.html` and `{name}.txt`.")
    out += ["", "**Self time by package** (where the samples landed):", ""]
    out.append(table(["package", "self time (s)", "share"],
                      [[n, f"{t:.2f}", f"{share * 100:.1f}%"]
                       for n, t, share in profile["by_package"]]))
    out += ["", "**Heaviest stream_jobs functions** (inclusive time, counted once per call "
            "chain):", ""]
    out.append(table(["function (module)", "inclusive (s)", "share of all samples"],
                      [[n, f"{t:.2f}", f"{share * 100:.1f}%"]
                       for n, t, share in profile["stream_jobs_functions"]]))
    out += ["", "**Top of the call tree**:", "", "```text", profile["tree"], "```", ""]
    return out




def latency_section(steps: list[dict[str, Any]]) -> list[str]:
    """`## Latency detail`: the end-to-end capacity search, a row per step."""
    if not steps:
        return []
    out = ["## Latency detail", "", "The end-to-end capacity search: a worker and a "
           "paced producer process, the offered rate raised a tenth of the no-op drain "
           "rate at a time until a step did not keep up (the pacer offered less than "
           "97% of the rate, or p99 went over 1 s: a backlog building). Latencies in "
           "ms.", ""]
    rows = [[f"{step['rate']:,.0f}", f"{step['offered_per_s']:,.0f}",
             f"{step['started_per_s']:,.0f}", f"{step['p50']:.1f}", f"{step['p99']:.1f}",
             "yes" if step["kept_up"] else "no"] for step in steps]
    columns = ["asked (jobs/s)", "offered", "started", "p50", "p99", "kept up"]
    return [*out, table(columns, rows), ""]


def retry_section(retry_runs: list[dict[str, Any]]) -> list[str]:
    """`## Retry detail`: each run's lateness against 5 s and the relay's counters."""
    if not retry_runs:
        return []
    out = ["## Retry detail", "", "Lateness of each run's retries against 5 s (ms), and "
           "the relay's counters (a hop is a record taken from a tier before it was due "
           "and written back to a tier).", ""]
    rows = []
    seen: dict[str, int] = {}
    for run in retry_runs:
        late = run["late_ms"]
        kind = "warm" if run.get("warm") else "cold"
        seen[kind] = seen.get(kind, 0) + 1
        rows.append([f"{kind} #{seen[kind]}", f"{late[0]:.0f}",
                     f"{late[len(late) // 2]:.0f}",
                     f"{late[min(len(late) - 1, len(late) * 9 // 10)]:.0f}",
                     f"{late[-1]:.0f}", str(sum(1 for v in late if v > 1500)),
                     str(run.get("relay_released")), str(run.get("relay_hops"))])
    columns = ["run", "min", "p50", "p90", "max", "over 1.5 s", "relay released", "relay hops"]
    return [*out, table(columns, rows), ""]


def run_section(data: dict[str, Any]) -> list[str]:
    """`## Run`: each section's seconds and the load after it; the sections that failed."""
    loads = data["details"].get("load_avg_after", {})
    out = ["## Run", "", "The 1-minute load average after each section shows how busy the "
           "box was (2 cores; other work on the box counts too).", "",
           table(["section", "seconds", "load average after"],
                 [[k, f"{v:.0f}", f"{loads.get(k, float('nan')):.1f}"]
                  for k, v in data["timings_s"].items()]), ""]
    if data.get("errors"):
        out += ["### Sections that failed", ""]
        out += [f"- **{name}**: {text}" for name, text in data["errors"].items()]
        out.append("")
    return out
