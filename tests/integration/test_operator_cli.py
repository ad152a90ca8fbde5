"""The CLI as an operator meets it: the demo end to end, and one-sentence errors."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.settings import Settings
from tests.integration.cli_env import settings_env

from .conftest import Declare

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("stream-jobs"))
# The bound for the demo once the stack is warm.
DEMO_LIMIT_S = 120.0
# CLI starts at once: each import costs a second or two of CPU on a shared machine.
PARALLEL_CLI = 4


def _env(settings: Settings) -> dict[str, str]:
    return settings_env(settings, COLUMNS="120")


async def _run(settings: Settings, *args: str, timeout_s: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=ROOT, env=_env(settings), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _rows(out: str, title: str) -> list[list[str]]:
    """The body rows of the rich table titled `title` in `out`, as lists of cells."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return rows


async def test_demo_ends_with_every_effect_once_and_matching_stats(settings: Settings) -> None:
    demo = settings.model_copy(update={"topics_dir": ROOT / "topics"})
    started = time.monotonic()
    code, out, err = await _run(demo, "demo", "--no-start-stack", timeout_s=240)
    took_s = time.monotonic() - started
    assert code == 0, out[-3000:] + err[-3000:]
    assert took_s < DEMO_LIMIT_S, f"the demo took {took_s:.0f} s on a warm stack"
    assert "every effect happened exactly once" in out
    assert "stats match" in out

    enqueued = re.search(r"enqueued (\d+) jobs and (\d+) malformed records in [\d.]+ s", out)
    assert enqueued is not None, out
    idle = re.search(r"all workers idle after ([\d.]+) s", out)
    assert idle is not None, out
    assert float(idle.group(1)) < took_s

    # The live progress ends showing each type's done and dead-lettered at what it expects.
    progress = {row[0]: row for row in _rows(out, "demo progress")}
    assert set(progress) == {"email.send", "image.resize", "search.index"}
    total = int(enqueued.group(1)) + int(enqueued.group(2))
    assert sum(int(row[1]) for row in progress.values()) == total
    for name, (_, sent, done, _retried, dead, expired, in_flight) in progress.items():
        done_now, done_want = done.split("/")
        dead_now, dead_want = dead.split("/")
        assert (done_now, dead_now, in_flight) == (done_want, dead_want, "0"), name
        assert int(done_now) + int(dead_now) + int(expired) == int(sent), name

    # The run's history process counted every outcome once, in its totals and its minute
    # windows in Postgres, where `serve` reads its charts.
    assert "history matches" in out
    history = {row[0]: row for row in _rows(out, "demo history")}
    assert set(history) == set(progress)
    for name, (_, counted, totals, minutes, exact) in history.items():
        _, _, done, retried, dead, expired, _ = progress[name]
        ended = int(done.split("/")[0]) + int(retried) + int(dead.split("/")[0]) + int(expired)
        assert (counted, totals, minutes, exact) == (str(ended), str(ended), str(ended),
                                                      "yes"), name
    # The dashboard on this run: `make demo-serve` serves it from the run's settings file.
    assert "make demo-serve" in out, out
    run = re.search(r"demo run (demo-\S+) on", out)
    assert run is not None, out
    stack_dir = ROOT / settings.stack_dir  # the CLI ran in ROOT; an absolute path stays
    exports = (stack_dir / "demo.env").read_text()
    assert f"export STREAM_JOBS_TOPIC_PREFIX={run.group(1)}\n" in exports, exports
    assert "consumers/demo_topics\n" in exports, exports

    # The stats table: nothing waits in a lane or tier, the DLQ holds the dead-lettered
    # jobs (its row says how many letters they left: "dlq (N letters)").
    outcomes = {row[0]: row for row in _rows(out, "demo outcomes")}
    waiting: dict[str, dict[str, str]] = {}
    job_type = ""
    for row in _rows(out, "waiting under"):
        job_type = row[0] or job_type
        waiting.setdefault(job_type, {})[row[1]] = row[2]
    assert set(waiting) == set(progress)
    for name, places in waiting.items():
        dlq = next(where for where in places if where.startswith("dlq"))
        assert places.pop(dlq) == outcomes[name][4], name  # dead-lettered jobs
        assert set(places.values()) == {"0"}, (name, places)


async def test_mistakes_get_one_sentence_and_a_nonzero_exit(
        settings: Settings, declare: Declare, app: App) -> None:
    await declare("real.type", partitions=1, priorities=["high", "default"])
    async with app.client() as client:
        await client.enqueue_many([Job("real.type", {"n": i}) for i in range(3)])
    lane = f"{settings.topic_prefix}.real.type"
    group = f"{lane}.worker"
    job_id = "01a2265a-9f17-7019-a966-4a00c51fb752"
    # Each mistake, and words its one sentence must hold.
    mistakes: list[tuple[list[str], str]] = [
        (["stats", "nope.type"], "Unknown job type 'nope.type'"),
        (["enqueue", "nope.type", "{}"], "Unknown job type 'nope.type'"),
        (["dlq", "list", "nope.type"], "Unknown job type 'nope.type'"),
        (["dlq", "show", "nope.type", job_id], "Unknown job type 'nope.type'"),
        (["dlq", "requeue", "nope.type", "--all"], "Unknown job type 'nope.type'"),
        (["dlq", "purge", "nope.type", "--yes"], "Unknown job type 'nope.type'"),
        (["job", job_id, "--type", "nope.type"], "Unknown job type 'nope.type'"),
        (["worker", "consumers.demo:app", "--type", "nope.type"], "nope.type"),
        (["worker", "consumers.demo:app", "--type", "real.type"],
         "This app has no handler for 'real.type'"),
        (["worker", "consumers.demo:app", "--processes", "many"],
         "--processes (STREAM_JOBS_WORKER_PROCESSES) takes a number"),
        (["throttle", "nope.type", "5/s"], "Unknown job type 'nope.type'"),
        (["drain", "real.type", "--rate", "fast"], "'fast' is not a rate"),
        (["dlq", "list", "real.type", "--since", "last tuesday"], "--since"),
        (["replay", f"{lane}.nope", "--partition", "0", "--from-offset", "0"],
         "does not exist"),
        (["replay", lane, "--partition", "0", "--from-offset", "999"],
         "Offset 999 is out of range for"),
        (["replay", lane, "--partition", "0", "--from-offset", "0", "--to-offset", "999"],
         "holds offsets 0 to 2"),
        (["replay", lane, "--partition", "7", "--from-offset", "0"], "no partition 7"),
        (["replay", lane, "--from-time", "yesterday-ish"], "'yesterday-ish' is not a time"),
        (["replay", lane, "--partition", "0", "--from-offset", "0", "--to-time", "whenever"],
         "'whenever' is not a time"),
        (["replay", lane, "--partition", "0", "--from-offset", "0", "--to-lane", "nope.type"],
         "Unknown job type 'nope.type'"),
        (["replay", lane, "--partition", "0", "--from-offset", "0", "--to-lane",
          "real.type:low"], "has no 'low' lane"),
        (["offsets", "reset", group, "--to-offset", "-5"], "negative"),
        (["offsets", "reset", group, "--to-offset", "999"], "can be set to 0 to 3"),
        (["offsets", "reset", group, "--to-time", "half past never"],
         "'half past never' is not a time"),
        (["offsets", "reset", f"{settings.topic_prefix}.nope.type.worker", "--to-earliest"],
         "reads none of our topics"),
        (["offsets", "reset", group, "--topic", f"{lane}.nope", "--to-earliest"],
         "does not exist"),
        (["enqueue", "real.type", "{}", "--delay", "soon"], "'soon' is not a duration"),
        (["enqueue", "real.type", "{}", "--expires-in", "forever"],
         "'forever' is not a duration"),
        (["enqueue", "real.type", "{}", "--priority", "urgent"], "has no 'urgent' lane"),
        (["enqueue", "real.type", "{not json"], "The payload is not JSON"),
        (["enqueue", "real.type", "[1, 2]"], "must be a JSON object"),
    ]
    gate = asyncio.Semaphore(PARALLEL_CLI)

    async def attempt(args: list[str]) -> tuple[int, str, str]:
        async with gate:
            return await _run(settings, *args)

    answers = await asyncio.gather(*(attempt(args) for args, _ in mistakes))
    wrong = []
    for (args, words), (code, out, err) in zip(mistakes, answers, strict=True):
        lines = err.strip().splitlines()
        if (code != 1 or "Traceback" in err + out or len(lines) != 1
                or not lines[0].startswith("error: ") or words not in lines[0]
                or out):
            wrong.append(f"{' '.join(args)} -> exit {code}, stdout {out!r}, stderr {err!r}")
    assert not wrong, "\n".join(wrong)
