"""The readers of the history against the real stack: `stats TYPE --history` (table and
--json), `GET /types/{type}/history`, the dashboard's charts and figures, and
`stream_jobs_history_jobs_total` on the gateway's /metrics.

The first tests write windows straight into stream_jobs_history (`HistoryStore.put`), so
every number a reader shows is known. The last runs the whole path: a worker's jobs with
known outcomes, the history app in-process, a gateway process whose dashboard draws
them, and the same counts after that gateway is stopped and started again.
Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson

from stream_jobs.app import App
from stream_jobs.clock import now_ms
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.gateway import create_app
from stream_jobs.history.process import run_history
from stream_jobs.history.store import TOTAL_SIZE_S, HistoryStore, WindowRow
from stream_jobs.history.tally import Tally
from stream_jobs.history.windows import window_start
from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env
from tests.integration.served_gateway import serve_env, serving
from tests.waiting import until

from .conftest import Declare
from .test_gateway import metric, served

STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
MIN_MS = 60_000


def _tally(outcomes: dict[str, int], slow: int = 0) -> Tally:
    """`outcomes`, with a run of 20 ms after a 300 ms wait per job, `slow` of them 2 s
    after a 40 s wait."""
    tally = Tally(dict(outcomes))
    finished = sum(outcomes.values())
    for i in range(finished):
        tally.observe(*((2.0, 40.0) if i < slow else (0.02, 0.3)))
    return tally


async def _known_windows(settings: Settings, job_type: str) -> list[WindowRow]:
    """Three closed minute windows a few minutes back, an hour window, the running total."""
    minute = window_start(now_ms(), 60)
    hour = window_start(now_ms(), 3600)
    rows = [WindowRow(job_type, 60, minute - 3 * MIN_MS,
                      _tally({"succeeded": 90, "retried": 6, "dead_lettered": 4}, slow=5)),
            WindowRow(job_type, 60, minute - 2 * MIN_MS, _tally({"succeeded": 50})),
            WindowRow(job_type, 60, minute - 1 * MIN_MS,
                      _tally({"succeeded": 30, "dead_lettered": 10, "expired": 2})),
            WindowRow(job_type, 3600, hour - 2 * 3_600_000, _tally({"succeeded": 7})),
            WindowRow(job_type, TOTAL_SIZE_S, 0,
                      Tally({"succeeded": 5000, "retried": 6, "dead_lettered": 14,
                             "expired": 2}))]
    store = HistoryStore(settings)
    try:
        await store.put(rows)
    finally:
        await store.close()
    return rows


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(STREAM_JOBS), "stats", *args], env=settings_env(settings),
                          capture_output=True, text=True, timeout=60, check=False)


async def test_stats_history_table_json_and_errors(settings: Settings, app: App,
                                                   declare: Declare) -> None:
    """`stats TYPE --history`: every window in --json with its outcomes and percentiles,
    5-minute rows and a totals line in the table, hour windows for 24h; a bad window, no
    TYPE or an unknown type is one line and exit 1; an empty span says how to start the
    history process."""
    await declare("hist.cli")
    await declare("hist.none")
    rows = await _known_windows(settings, "hist.cli")

    doc = orjson.loads(_cli(settings, "hist.cli", "--history", "1h", "--json").stdout)
    assert (doc["job_type"], doc["window"], doc["size_s"], doc["note"]) == (
        "hist.cli", "1h", 60, None)
    assert [r["start_ms"] for r in doc["rows"]] == [r.start_ms for r in rows[:3]]
    first = doc["rows"][0]
    assert first["outcomes"] == {"dead_lettered": 4, "retried": 6, "succeeded": 90}
    assert (first["finished"], first["failed"], first["failure_ratio"]) == (100, 10, 0.1)
    assert first["per_min"] == 100.0
    assert first["start"].endswith(":00.000Z")
    assert first["duration_s"] == {"p50": 0.025, "p95": 0.025, "p99": 2.5}  # 5 slow of 100
    assert first["dwell_s"] == {"p50": 0.5, "p95": 0.5}
    assert doc["totals"]["outcomes"] == {"dead_lettered": 14, "expired": 2, "retried": 6,
                                         "succeeded": 170}
    day = orjson.loads(_cli(settings, "hist.cli", "--history", "24h", "--json").stdout)
    assert (day["size_s"], [r["finished"] for r in day["rows"]]) == (3600, [7])

    table = _cli(settings, "hist.cli", "--history", "1h")
    assert table.returncode == 0, table.stderr
    total_line = next(line for line in table.stdout.splitlines() if line.startswith("total"))
    assert total_line.split()[1:6] == ["170", "6", "14", "2", "10.4%"]  # 20 failed of 192
    assert "a row per 5 min" in table.stdout

    for args, says in [(["hist.cli", "--history", "2h"], "use one of 1h, 24h, 7d"),
                       (["--history", "1h"], "--history shows one type"),
                       (["nope", "--history", "1h"], "Unknown job type 'nope'"),
                       (["hist.cli", "--history", "1h", "--watch"], "drop --watch")]:
        bad = _cli(settings, *args)
        assert bad.returncode == 1, (args, bad.stdout, bad.stderr)
        assert says in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    empty = _cli(settings, "hist.none", "--history", "7d")
    assert empty.returncode == 0
    assert "stream-jobs history" in empty.stdout
    assert "serve --history" in " ".join(empty.stdout.split())


def _figures(page: str, job_type: str) -> dict[str, str]:
    card = page.split(f'data-type="{job_type}"', 1)[1].split("</section>", 1)[0]
    found = dict(re.findall(r'data-(?:figure|outcome)="([\w-]+)"[^>]*>([^<]*)<', card))
    found |= {f"chart {t}": v for t, v in re.findall(
        r'class="chart-title">([^:<]+): ([^<]*)</text>', card)}
    note = re.search(r'data-note="history">([^<]*)<', card)
    if note:
        found["note"] = html.unescape(note.group(1))
    return found


async def test_route_dashboard_and_metric_read_the_windows(settings: Settings, app: App,
                                                           declare: Declare) -> None:
    """The route answers what --json prints; the dashboard's history figures and charts
    show the hour's numbers, the lag chart says it is the gateway's own; /metrics counts
    the running totals; a type without history says how to start it."""
    await declare("hist.gw")
    await declare("hist.none")
    await _known_windows(settings, "hist.gw")
    gateway = create_app(settings.model_copy(update={"gateway_sample_interval_s": 0.3}))
    async with served(gateway) as http:
        answer = await http.get("/types/hist.gw/history", params={"window": "1h"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        cli = orjson.loads(_cli(settings, "hist.gw", "--history", "1h", "--json").stdout)
        assert body["rows"] == cli["rows"]
        assert body["totals"]["outcomes"] == cli["totals"]["outcomes"]
        assert (await http.get("/types/hist.gw/history")).json()["window"] == "1h"
        week = (await http.get("/types/hist.gw/history", params={"window": "7d"})).json()
        assert [r["finished"] for r in week["rows"]] == [7]

        bad = await http.get("/types/hist.gw/history", params={"window": "2h"})
        assert bad.status_code == 422
        assert "'1h', '24h' or '7d'" in bad.text
        unknown = await http.get("/types/nope/history")
        assert unknown.status_code == 404
        assert "nope" in unknown.json()["detail"]
        none = (await http.get("/types/hist.none/history")).json()
        assert none["rows"] == []
        assert "stream-jobs history" in none["note"]

        await _metric_counts_the_totals(http)

        async def page() -> dict[str, str]:
            shown = (await http.get("/")).text
            return _figures(shown, "hist.gw") if 'data-type="hist.gw"' in shown else {}

        async def drawn() -> bool:
            return (await page()).get("hour-finished") == "192"

        await until(drawn, "the dashboard to show the hour's 192 jobs")
        shown = await page()
        assert (shown["succeeded"], shown["dead_lettered"], shown["expired"]) == (
            "170", "14", "2")
        assert shown["hour-failure-ratio"] == "10.4%"  # 20 failed of 192
        assert (shown["hour-duration-p95"], shown["hour-dwell-p95"]) == ("0.025 s", "0.5 s")
        # The charts' last points: the newest closed minute window (30 + 10 + 2 jobs).
        assert shown["chart jobs/min"] == "42 /min"
        assert shown["chart failure ratio"] == "24%"
        assert shown["chart p95 duration"] == "0.025 s"
        assert "chart lag since the gateway started" in shown
        none_card = _figures((await http.get("/")).text, "hist.none")
        assert "history process is not running" in none_card["note"]
        assert "stream-jobs history" in none_card["note"]


async def _metric_counts_the_totals(http: httpx.AsyncClient) -> None:
    """/metrics has the history's running totals (read at the sampler's pace)."""
    async def counted() -> bool:
        text = (await http.get("/metrics")).text
        return metric(text, "stream_jobs_history_jobs_total", type="hist.gw",
                      outcome="succeeded") == 5000

    await until(counted, "/metrics to count the history's totals")
    text = (await http.get("/metrics")).text
    assert metric(text, "stream_jobs_history_jobs_total", type="hist.gw",
                  outcome="dead_lettered") == 14
    assert metric(text, "stream_jobs_history_jobs_total", type="hist.none") is None


async def test_a_gateway_restart_keeps_the_last_hours_charts(
        settings: Settings, app: App, declare: Declare, tmp_path: Path) -> None:
    """End to end: a worker runs 200 jobs (every fifth dead-lettered) while the history
    app runs in-process; a gateway process draws them on its dashboard; stopped and
    started again, it draws the same counts."""
    await declare("hist.e2e", max_attempts=1)
    history_settings = settings.model_copy(update={
        "history_window_s": 2, "history_data_dir": tmp_path / "history"})
    app.use_settings(history_settings)

    @app.job("hist.e2e", concurrency=8)
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        if job["n"] % 5 == 0:
            raise PermanentError("every fifth")

    stop = asyncio.Event()
    history = asyncio.create_task(run_history(history_settings, stop))
    store = HistoryStore(history_settings)
    try:
        async with app.client() as client:
            for n in range(200):
                await client.enqueue("hist.e2e", {"n": n})
        worker = app.worker("hist.e2e", report_interval_s=0.2)
        await worker.run(until_idle=True)
        expected = {"succeeded": 160, "dead_lettered": 40}
        assert dict(worker.outcomes) == expected

        async def recorded() -> bool:
            if history.done():
                history.result()  # raises why it stopped
            totals = await store.totals()
            return "hist.e2e" in totals and totals["hist.e2e"].outcomes == expected

        await until(recorded, "the history to count the worker's 200 jobs", within_s=120)
        figures = [await _dashboard_of(history_settings, tmp_path / f"gateway-{i}.log")
                   for i in (1, 2)]
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await history
        await store.close()
    assert figures[0] == figures[1]
    assert (figures[0]["hour-finished"], figures[0]["succeeded"],
            figures[0]["dead_lettered"]) == ("200", "160", "40")
    assert figures[0]["hour-failure-ratio"] == "20.0%"


async def _dashboard_of(settings: Settings, log: Path) -> dict[str, str]:
    """The history figures a fresh gateway process draws for hist.e2e once every job
    is in a closed window (its charts draw closed windows only)."""
    env = serve_env(settings, settings.topics_dir, STREAM_JOBS_HISTORY_WINDOW_S="2",
                    STREAM_JOBS_GATEWAY_SAMPLE_INTERVAL_S="0.3")
    with serving(env, log, "--no-auth") as (port, _):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            shown: dict[str, str] = {}

            async def drawn() -> bool:
                nonlocal shown
                page = (await http.get("/")).text
                if 'data-type="hist.e2e"' not in page:
                    return False
                shown = _figures(page, "hist.e2e")
                route = (await http.get("/types/hist.e2e/history")).json()
                closed = sum(r["finished"] for r in route["rows"] if not r["open"])
                return shown.get("hour-finished") == "200" and closed == 200

            await until(drawn, "the dashboard to draw the 200 jobs", within_s=60)
    charts = {k for k in shown if k.startswith("chart ")}
    assert charts == {"chart jobs/min", "chart failure ratio", "chart p95 duration",
                      "chart p95 dwell", "chart lag since the gateway started"}
    assert shown["chart jobs/min"] != "no data"
    # The lag chart is the gateway's own samples: not compared across the restart.
    return {k: v for k, v in shown.items() if not k.startswith("chart lag")}
