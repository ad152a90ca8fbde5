"""The batch-callback trial: a batch's callbacks run once, after the last member, with the
right counts, while workers are killed with SIGKILL.

    .venv/bin/python -m ops.chaos.batches        # 5,000 members, 3 workers, 6 kills
    BATCH_MEMBERS=20000 BATCH_KILLS=10 .venv/bin/python -m ops.chaos.batches

A run gets a fresh prefix and schema. `client.batch` writes the members (through the
outbox, in one transaction) with `on_success` and `on_complete` callbacks; three
`stream-jobs worker ops.chaos.batch_app:app` processes run them (each with its outbox
relay), a fiftieth of the members failing their first attempt. Each time another share
of the members is done a random worker gets SIGKILL and a new one starts. Once every
member is done and the callbacks ran, the runner waits until nothing is left to do (the
outbox empty, every lane and tier read to its end by its group), stops the workers, and
`batch_verdict.judge` decides from the tables. `make chaos` runs it (`CHAOS_ONLY=batch`);
tests/integration/test_batch_faults.py runs it small.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from ops.chaos.batch_app import ALBUM, FAIL_EVERY_ENV, HOLD_MS_ENV, MEMBER, TABLES
from ops.chaos.batch_verdict import BatchEvidence, BatchVerdict, CallbackRow, judge
from ops.chaos.faults import until
from ops.chaos.workers import STREAM_JOBS, WorkerGroup
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.job_ids import new_job_id
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import admin_client, open_admin
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import relay_group, worker_group
from stream_jobs.outbox.depth import read_depth
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.settings import Settings, load_settings
from stream_jobs.workflows.progress import read_progress

log = logging.getLogger("ops.chaos.batches")
SCENARIO = "batch"
TITLE = "a batch's callbacks through kill -9"
METHOD = ("a batch of 5,000 members (`client.batch`, through the outbox) with `on_success` "
          "and `on_complete` callbacks, on 3 `stream-jobs worker` processes, 2 % of members "
          "failing their first attempt; each time another seventh of the members is done a "
          "random worker gets SIGKILL and a new one starts (6 kills). Judged from the "
          "tables: every member's effect exactly once, each callback's effect exactly once "
          "and later than the last member's, the counts the callbacks saw.")
APP_SPEC = "ops.chaos.batch_app:app"
OUT_DIR = Path(__file__).resolve().parent / "out"


@dataclass
class BatchTrialResult:
    """One trial: its verdict, what was done to it, how long it took."""

    members: int
    workers: int
    kills: int
    seconds: float
    verdict: BatchVerdict
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.notes

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "verdict"},
                "verdict": {**asdict(self.verdict), "ok": self.verdict.ok}, "ok": self.ok}


def batch_row(result: BatchTrialResult, run: int) -> dict[str, Any]:
    """One run as results.json keeps it."""
    return {"run": run, "started": time.time() - result.seconds, **result.to_dict()}


def batch_section(rows: list[dict[str, Any]]) -> list[str]:
    """The `## Batch callbacks` section of RESULTS.md: a line per run, and the method."""
    lines = ["## Batch callbacks", "", f"**{SCENARIO}** ({TITLE}): {METHOD}", "",
             "| run | members | workers | kill -9 | lost | dup effects | on_success | "
             "on_complete | callback deliveries | run s | ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v = r["verdict"]
        lines.append(f"| {r['run']} | {r['members']:,} | {r['workers']} | {r['kills']} | "
                     f"{v['lost']} | {v['duplicate_effects']} | "
                     f"{v['callbacks'].get('success', 0)} | {v['callbacks'].get('complete', 0)} "
                     f"| {v['callback_runs']} | {r['seconds']:.0f} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    problems = [(r["run"], p) for r in rows for p in [*r["verdict"]["problems"], *r["notes"]]]
    if problems:
        lines += ["", *[f"- {SCENARIO} run {n}: {p}" for n, p in problems]]
    return lines


def _declare(folder: Path) -> Path:
    topics = folder / "topics"
    topics.mkdir(parents=True)
    (topics / f"{MEMBER}.toml").write_text('partitions = 6\nretry_tiers = ["1s"]\n'
                                           "max_attempts = 3\n")
    (topics / f"{ALBUM}.toml").write_text('partitions = 1\nretry_tiers = ["1s"]\n')
    return topics


async def batch_trial(base: Settings, out_dir: Path, *, members: int = 5_000, workers: int = 3,
                      kills: int = 6, fail_every: int = 50, hold_ms: int = 2,
                      within_s: float = 600.0) -> BatchTrialResult:
    """One trial against the services `base` names (see the module's docstring)."""
    name = f"bt{uuid.uuid4().hex[:10]}"
    folder = out_dir / name
    settings = base.model_copy(update={"database_schema": name, "topic_prefix": name,
                                       "topics_dir": _declare(folder)})
    await prepare_schema(settings, TABLES)
    types = load_job_types(settings.topics_dir)
    await apply(settings, types)
    group = WorkerGroup(settings, folder, argv=(str(STREAM_JOBS), "worker", APP_SPEC),
                        env={FAIL_EVERY_ENV: str(fail_every), HOLD_MS_ENV: str(hold_ms)})
    began = time.monotonic()
    notes: list[str] = []
    member_ids = tuple(new_job_id() for _ in range(members))
    batch_id = ""
    try:
        for _ in range(workers):
            group.start()
        batch_id = await App(settings).client().batch(
            [Job(MEMBER, {"n": n}, job_id=job_id) for n, job_id in enumerate(member_ids)],
            on_success=Job(ALBUM, {"kind": "success"}),
            on_complete=Job(ALBUM, {"kind": "complete"}))
        await _kill_as_it_goes(settings, group, batch_id, members, kills, within_s)
        await until(lambda: _pending_is(settings, batch_id, 0), within_s, "every member done")
        await until(lambda: _callbacks(settings, 2), within_s, "both callbacks")
        await until(lambda: _quiet(settings, types.values()), within_s, "nothing left to do")
        for worker in group.live():
            group.terminate(worker)
        for worker in group.members:
            group.stopped(worker)
    except Exception as exc:  # a wait that timed out: judge what there is
        notes.append(f"{type(exc).__name__}: {exc}")
        log.error("batch trial %s: %s\n%s", name, exc, group.tails())
    finally:
        group.close()
    verdict = judge(await _evidence(settings, batch_id, member_ids))
    result = BatchTrialResult(members, workers, len(group.killed),
                              round(time.monotonic() - began, 1), verdict, notes)
    if result.ok:
        await _drop(settings, types.values())
    else:
        log.error("batch trial %s kept its topics and schema for a look: %s", name,
                  verdict.problems + notes)
    return result


async def _kill_as_it_goes(settings: Settings, group: WorkerGroup, batch_id: str,
                           members: int, kills: int, within_s: float) -> None:
    """SIGKILL a random worker each time another 1/(kills + 1) of the members is done,
    and start another in its place."""
    for k in range(1, kills + 1):
        target = members * k // (kills + 1)
        await until(partial(_done_at_least, settings, batch_id, target), within_s,
                    f"{target} members done")
        victim = random.choice(group.live())
        log.info("kill -9 %s (pid %d) at %d members done", victim.name, victim.pid, target)
        group.kill(victim)
        group.start()


async def _done_at_least(settings: Settings, batch_id: str, target: int) -> bool:
    progress = await read_progress(settings, batch_id)
    return progress.succeeded + progress.failed >= target


async def _pending_is(settings: Settings, batch_id: str, pending: int) -> bool:
    return (await read_progress(settings, batch_id)).pending == pending


async def _fetch(settings: Settings, sql: str) -> list[Any]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def _callbacks(settings: Settings, at_least: int) -> bool:
    rows = await _fetch(settings, "SELECT count(*) AS n FROM batch_callback_effects")
    return int(rows[0]["n"]) >= at_least


async def _quiet(settings: Settings, policies: Sequence[JobTypePolicy] | Any) -> bool:
    """The outbox is empty and every lane and tier is read to its end by its group."""
    if (await read_depth(settings)).depth:
        return False
    prefix = settings.topic_prefix
    async with open_reader(settings) as reader, open_admin(settings) as admin:
        for policy in policies:
            for group, topics in ((worker_group(prefix, policy.job_type),
                                   list(policy.lane_topics(prefix).values())),
                                  (relay_group(prefix, policy.job_type),
                                   list(policy.tier_topics(prefix).values()))):
                tps = [TopicPartition(t, p) for t in topics
                       for p in range(policy.partitions)]
                ends = await reader.end_offsets(tps)
                committed = await admin.committed_offsets(group, tps)
                if any(end > (committed.get(tp) or 0) for tp, end in ends.items()):
                    return False
    return True


async def _evidence(settings: Settings, batch_id: str, member_ids: tuple[str, ...]
                    ) -> BatchEvidence:
    effects = await _fetch(settings, "SELECT job_id, count(*) AS n, max(at) AS last "
                                     "FROM batch_member_effects GROUP BY job_id")
    callbacks = await _fetch(settings, "SELECT job_id, kind, payload, at "
                                       "FROM batch_callback_effects")
    runs = await _fetch(settings, "SELECT count(*) AS n FROM batch_callback_runs")
    return BatchEvidence(
        batch_id, member_ids, {r["job_id"]: int(r["n"]) for r in effects},
        max((r["last"] for r in effects), default=None),
        tuple(CallbackRow(r["job_id"], r["kind"], orjson.loads(r["payload"]), r["at"])
              for r in callbacks), int(runs[0]["n"]))


async def _drop(settings: Settings, policies: Any) -> None:
    """A clean run leaves nothing behind (a failed one keeps its topics and schema)."""
    with contextlib.suppress(Exception):
        async with admin_client(settings) as admin:
            await admin.delete_topics([s.name for policy in policies
                                       for s in policy.all_topics(settings.topic_prefix)])
    with contextlib.suppress(Exception):
        conn = await asyncpg.connect(settings.database_url)
        try:
            await conn.execute(f'DROP SCHEMA "{settings.database_schema}" CASCADE')
        finally:
            await conn.close()


async def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    result = await batch_trial(load_settings(), OUT_DIR,
                               members=int(os.environ.get("BATCH_MEMBERS", "5000")),
                               workers=int(os.environ.get("BATCH_WORKERS", "3")),
                               kills=int(os.environ.get("BATCH_KILLS", "6")))
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / "batch.json").write_bytes(orjson.dumps(result.to_dict(),
                                                      option=orjson.OPT_INDENT_2))
    v = result.verdict
    print(f"batch of {v.members:,} members, {result.workers} workers, {result.kills} kill -9: "
          f"lost {v.lost}, duplicate effects {v.duplicate_effects}, callbacks {v.callbacks} "
          f"({v.callback_runs} deliveries), {result.seconds:.0f} s: "
          f"{'ok' if result.ok else 'PROBLEMS: ' + '; '.join(v.problems + result.notes)}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
