"""The history process counting through kill -9 of workers and of itself:
`CHAOS_ONLY=history make chaos`.

    CHAOS_ONLY=history make chaos                 # 4,000 jobs, 3 workers, 4 + 2 kills
    CHAOS_ONLY=history CHAOS_JOBS=10000 make chaos

A run gets a fresh prefix and schema, and windows of 2 s
(`STREAM_JOBS_HISTORY_WINDOW_S`, workers and history alike) so that many pass. One
`stream-jobs history` process and three `stream-jobs worker ops.chaos.history_app:app`
processes run; `chaos.counted` has `heartbeat_interval = "1s"`, so each worker reports
every 0.25 s. The jobs are enqueued over 20 s; a fifth fail for good (dead-lettered),
the others write their effect through `ctx.once()`. Each time another fifth of the jobs
has ended a random worker gets SIGKILL and another starts; after the first and the
third, the history process too gets SIGKILL (once it counts more than at its previous
kill: while it folds reports, with jobs still to come) and another starts on the same
folder; after the second, the stack's Postgres restarts (the workers' effects and the
history's windows both live there; a job failing meanwhile is retried through delay
tiers of 1 s and 5 s). Once every job has ended, the workers stop, the history catches
up (its running total, minute and hour windows say what the workers reported and stay
put for 4 s), and `history_verdict.judge` decides: the history says exactly what the
workers' reports say (added up here from `P._stats`), and those fall short of what
happened (the effect rows, the DLQ topic) only by what the killed workers ended in their
last moments, as docs/history.md says a worker's kill -9 loses. `make chaos` runs it
(`TRIAL`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from ops.chaos import collect, paced
from ops.chaos.faults import until
from ops.chaos.fresh import fresh_settings, settle
from ops.chaos.history_app import COUNTED_TYPE, TABLES
from ops.chaos.history_verdict import HistoryEvidence, HistoryVerdict, judge
from ops.chaos.protocol import OwnTrial, TrialRow, row
from ops.chaos.trial import Stack
from ops.chaos.workers import STREAM_JOBS, WorkerGroup
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.history.reports import ReportSlots
from stream_jobs.history.store import HistoryStore
from stream_jobs.history.tally import Tally, total
from stream_jobs.kafka import scan
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.naming import dlq_topic, history_app_id, stats_topic
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.settings import Settings
from stream_jobs.testing.stack import declare_type

log = logging.getLogger("ops.chaos.history")
JOBS = 4_000
KILLS = 4
# The worker kills after which the history process dies too: early enough that jobs are
# still to come, so the kill lands while it counts (after the last, it had often counted
# everything already and the kill tested nothing).
HISTORY_KILLS_AFTER = (1, 3)
WINDOW_S = 2
REPORT_S = 0.25  # heartbeat_interval 1 s / 4 reports per interval
# A report sent but not in Kafka yet when its worker died, and an outcome recorded a
# little after its effect row: one more interval, and a margin.
IN_FLIGHT_S = 0.5
STABLE_S = 4.0
ENQUEUE_S = 20.0  # the jobs are enqueued over this long
APP_SPEC = "ops.chaos.history_app:app"
TITLE = ("the history's counts through kill -9 of workers and of the history process, and "
         "a Postgres restart")
METHOD = ("one `stream-jobs history` process and 3 `stream-jobs worker` processes, windows "
          "of 2 s, workers reporting every 0.25 s (`heartbeat_interval = \"1s\"`); 4,000 "
          "jobs enqueued over 20 s, a fifth failing for good (dead-lettered), the others "
          "writing their effect "
          "through `ctx.once()`; a random worker gets SIGKILL each time another fifth of "
          "the jobs has ended (4 kills, another starting each time), after the first and the "
          "third the history process too (while it folds reports; another starts on its "
          "folder), and after the second the stack's Postgres restarts (2 s down; a job "
          "failing meanwhile is retried through delay tiers of 1 s and 5 s). Judged once "
          "caught up "
          "(running total, minute and hour windows saying what the workers reported, "
          "still for 4 s): the three views agree and say "
          "exactly what the workers' reports on `P._stats` say (added up by the runner, "
          "each worker's slot as its latest report has it), whatever the history's kills; "
          "and the reports fall short of what happened (effect rows, DLQ records) only by "
          "what the killed workers ended in their last 0.75 s (their last report interval, "
          "a report in flight, a margin), which docs/history.md says a worker's kill -9 "
          "loses: the history is exact through its own kills, not through a worker's.")


@dataclass
class HistoryTrialResult:
    kills: int
    history_kills: int
    seconds: float
    caught_up_s: float
    verdict: HistoryVerdict
    notes: list[str] = field(default_factory=list)
    pg_restarts: int = 0
    reports_behind: int = 0  # past the history's committed offsets once caught up

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.notes


@dataclass
class Deaths:
    """The kills of a run: each worker's (pid, when), and how many jobs the history had
    counted at each of its own."""

    workers: list[tuple[int, float]] = field(default_factory=list)
    history_counted: list[int] = field(default_factory=list)  # its jobs at each kill


async def _views(store: HistoryStore) -> tuple[dict[str, int], ...]:
    """The running total's, the minute windows' and the hour windows' outcomes."""
    totals = (await store.totals()).get(COUNTED_TYPE, Tally())
    minutes = total([r.tally for r in await store.span(COUNTED_TYPE, WINDOW_S, 0)])
    hours = total([r.tally for r in await store.span(COUNTED_TYPE, WINDOW_S * 60, 0)])
    return dict(totals.outcomes), dict(minutes.outcomes), dict(hours.outcomes)


async def _ended(settings: Settings) -> int:
    return await paced.count(settings, "SELECT (SELECT count(DISTINCT job_id) FROM "
                             "history_effects) + (SELECT count(DISTINCT job_id) FROM "
                             "history_failures)")


async def _reports_behind(settings: Settings) -> int:
    """Reports of `P._stats` past the history process's committed offsets."""
    prefix = settings.topic_prefix
    committed, ends = await collect.offsets(settings, history_app_id(prefix),
                                            [stats_topic(prefix)])
    return sum(max(0, end - committed.get(tp, 0)) for tp, end in ends.items())


async def _caught_up(settings: Settings, store: HistoryStore, within_s: float) -> float:
    """Seconds until the history's three views say what the workers reported (read
    from `P._stats` once they stopped), agree, and have stayed put `STABLE_S`. Not its
    committed offsets, which once lagged its folding by minutes after a kill -9 (records
    faust dropped left a gap it would not commit past; docs/history.md)."""
    began = time.monotonic()
    reported = _only(await _reported(settings))
    last: tuple[dict[str, int], ...] = ()
    still_since = time.monotonic()
    while time.monotonic() - began < within_s:
        seen = await _views(store)
        if seen != last or any(_only(view) != reported for view in seen):
            last, still_since = seen, time.monotonic()
        elif time.monotonic() - still_since >= STABLE_S:
            return round(still_since - began, 1)
        await asyncio.sleep(0.5)  # a poll of Postgres, bounded by `within_s`
    raise TimeoutError(f"the history's views did not reach what the workers reported "
                       f"({reported}) within {within_s:.0f} s: {last}")


def _only(outcomes: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in outcomes.items() if v}


def _history_killer(history: WorkerGroup, workers: WorkerGroup, store: HistoryStore,
                    deaths: Deaths) -> Callable[[int], Awaitable[None]]:
    """What comes after worker kill k: note the victim; after some, kill the history."""

    async def after(k: int) -> None:
        # Its own kill time: a Postgres restart may have come between the kill and this.
        dead = workers.killed[-1]
        assert dead.killed_at is not None
        deaths.workers.append((dead.pid, dead.killed_at))
        if k not in HISTORY_KILLS_AFTER:
            return

        async def counting() -> bool:  # this history process folds reports
            return sum((await _views(store))[0].values()) > max(deaths.history_counted,
                                                                default=0)

        await until(counting, 120, "the history process to count more jobs")
        counted = sum((await _views(store))[0].values())
        victim = history.live()[0]
        log.info("kill -9 the history process %s (pid %d) at %d outcomes counted",
                 victim.name, victim.pid, counted)
        history.kill(victim)
        history.start()
        deaths.history_counted.append(counted)
    return after


async def _dead_letters(settings: Settings) -> int:
    topic = dlq_topic(settings.topic_prefix, COUNTED_TYPE)
    found = 0
    async with open_reader(settings, client_id="history-chaos-check") as consumer:
        await consumer.refresh_metadata()
        ranges = await scan.ranges(consumer, topic)
        async for record in scan.scan(consumer, topic, ranges):
            found += any(k == HEADER_JOB_ID for k, _ in record.headers)
    return found


async def _allowance(settings: Settings, deaths: Deaths, table: str) -> int:
    """Rows of `table` the killed workers wrote in their last report interval (and the
    time a report may be in flight) before they died."""
    each = [await paced.count(settings, f"SELECT count(*) FROM {table} WHERE pid = {pid} "
                                        f"AND at > {died - REPORT_S - IN_FLIGHT_S}")
            for pid, died in deaths.workers]
    log.info("%s: rows of the killed workers' last %.2f s: %s", table, REPORT_S + IN_FLIGHT_S,
             each)
    return sum(each)


async def _reported(settings: Settings) -> dict[str, int]:
    """What the workers' reports on `P._stats` say, added up: each (worker, slot) as the
    latest report that has it says (a report's slots are cumulative within each)."""
    topic = stats_topic(settings.topic_prefix)
    latest: dict[tuple[str, int], tuple[int, Tally]] = {}
    async with open_reader(settings, client_id="history-chaos-check") as consumer:
        await consumer.refresh_metadata()
        ranges = await scan.ranges(consumer, topic)
        async for record in scan.scan(consumer, topic, ranges):
            report = ReportSlots.from_json(record.value)
            if report is None or report.job_type != COUNTED_TYPE:
                continue
            for start, tally in report.slots.items():
                seen = latest.get((report.worker_id, start))
                if seen is None or seen[0] <= report.at_ms:
                    latest[report.worker_id, start] = (report.at_ms, tally)
    return dict(total([tally for _, tally in latest.values()]).outcomes)


async def _evidence(settings: Settings, store: HistoryStore, deaths: Deaths
                    ) -> HistoryEvidence:
    effects = await paced.fetch(settings, "SELECT count(*) AS n, count(DISTINCT job_id) AS d "
                                          "FROM history_effects")
    totals, minutes, hours = await _views(store)
    return HistoryEvidence(
        {"succeeded": int(effects[0]["d"]), "dead_lettered": await _dead_letters(settings)},
        {"succeeded": await _allowance(settings, deaths, "history_effects"),
         "dead_lettered": await _allowance(settings, deaths, "history_failures")},
        await _reported(settings), totals, minutes, hours, tuple(deaths.history_counted),
        int(effects[0]["n"]) - int(effects[0]["d"]))


async def _enqueue(settings: Settings, jobs: int) -> None:
    """The jobs over `ENQUEUE_S`, a slice a second: the workers keep pace, so a kill after
    a share of them is done comes with others still to be enqueued, and the history's
    kills land while reports still come (all enqueued at once, 4,000 jobs were done in a
    few seconds and a history kill often found everything counted already)."""
    each = max(1, math.ceil(jobs / ENQUEUE_S))
    async with App(settings).client() as client:
        for first in range(0, jobs, each):
            await client.enqueue_many(Job(COUNTED_TYPE, {"n": n})
                                      for n in range(first, min(jobs, first + each)))
            await asyncio.sleep(1.0)  # the pace of the enqueueing, not a wait for a state


async def history_trial(base: Settings, out_dir: Path, *, jobs: int = JOBS, workers: int = 3,
                        kills: int = KILLS, within_s: float = 300.0,
                        seed: int | None = None, stack: Stack | None = None
                        ) -> HistoryTrialResult:
    """One trial against the services `base` names (see the module's docstring); with
    `stack`, restarts its Postgres once on the way."""
    settings, folder = fresh_settings(base, out_dir, "history", history_window_s=WINDOW_S)
    settings = settings.model_copy(update={"history_data_dir": folder / "faust"})
    rng = random.Random(seed)
    await prepare_schema(settings, TABLES)
    policy = await declare_type(settings, COUNTED_TYPE, partitions=3, max_attempts=5,
                                retry_tiers=["1s", "5s"],
                                heartbeat_interval="1s")
    env = {"STREAM_JOBS_HISTORY_WINDOW_S": str(WINDOW_S),
           "STREAM_JOBS_HISTORY_DATA_DIR": str(settings.history_data_dir)}
    history = WorkerGroup(settings, folder / "history", argv=(str(STREAM_JOBS), "history"),
                          env=env)
    group = WorkerGroup(settings, folder / "workers",
                        argv=(str(STREAM_JOBS), "worker", APP_SPEC), env=env)
    store = HistoryStore(settings)
    deaths = Deaths()
    began = time.monotonic()
    caught_up_s = 0.0
    restarts = behind = 0
    notes: list[str] = []
    try:
        history.start()
        for _ in range(workers):
            group.start()
        async with asyncio.TaskGroup() as both:  # one failing stops the other
            both.create_task(_enqueue(settings, jobs))
            killing = both.create_task(paced.kill_per_share(
                group, lambda: _ended(settings), jobs, kills, within_s, rng,
                postgres=stack.postgres if stack else None,
                after=_history_killer(history, group, store, deaths)))
        restarts = killing.result()
        await until(lambda: paced.quiet(settings, [policy]), within_s, "nothing left to do")
        await paced.stop_all(group)
        caught_up_s = await _caught_up(settings, store, within_s)
        behind = await _reports_behind(settings)
        await paced.stop_all(history)
    except Exception as exc:  # a wait that timed out: judge what there is
        inner = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
        notes += [f"{type(e).__name__}: {e}" for e in inner]
        log.error("history trial %s: %s\n%s\n%s", settings.topic_prefix, exc,
                  history.tails(), group.tails())
    finally:
        group.close()
        history.close()
    try:
        verdict = judge(await _evidence(settings, store, deaths),
                        history_kills=len(HISTORY_KILLS_AFTER))
    finally:
        await store.close()
    result = HistoryTrialResult(len(group.killed), len(deaths.history_counted),
                                round(time.monotonic() - began, 1), caught_up_s, verdict, notes,
                                restarts, behind)
    await settle(settings, folder, [*verdict.problems, *notes])
    if not result.ok:
        log.error("history trial %s kept its topics and schema for a look: %s",
                  settings.topic_prefix, verdict.problems + notes)
    return result


async def _run(stack: Stack, out_dir: Path, run: int, jobs: int | None) -> TrialRow:
    started = time.time()
    result = await history_trial(stack.settings, out_dir, jobs=jobs or JOBS, stack=stack)
    v = result.verdict
    return row(run, started, [*v.problems, *result.notes], truth=v.truth,
               reported=v.reported, counted=v.counted,
               short=v.short, allowance=v.allowance, kills=result.kills,
               history_kills=result.history_kills, pg_restarts=result.pg_restarts,
               caught_up_s=result.caught_up_s, reports_behind=result.reports_behind,
               duplicate_effects=v.duplicate_effects)


def _pair(r: TrialRow, key: str, outcome: str) -> str:
    return f"{r[key].get(outcome, 0):,}"


def _cells(r: TrialRow) -> list[str]:
    return [*(" / ".join(_pair(r, k, o) for k in ("truth", "reported", "counted"))
              for o in ("succeeded", "dead_lettered")),
            *(f"{_pair(r, 'short', o)} (≤ {_pair(r, 'allowance', o)})"
              for o in ("succeeded", "dead_lettered")),
            str(r["kills"]), str(r["history_kills"]), str(r.get("pg_restarts", 0)),
            f"{r['caught_up_s']:g}", str(r.get("reports_behind", "")),
            str(r["duplicate_effects"]), f"{r['seconds']:.0f}", "yes" if r["ok"] else "NO"]


def _summary(r: TrialRow) -> str:
    return (f"happened / reported / counted: succeeded "
            f"{' / '.join(_pair(r, k, 'succeeded') for k in ('truth', 'reported', 'counted'))}"
            f", dead-lettered "
            f"{' / '.join(_pair(r, k, 'dead_lettered') for k in ('truth', 'reported', 'counted'))}"
            f"; short {r['short']} (allowed {r['allowance']}); {r['kills']} worker kills, "
            f"{r['history_kills']} history kills, {r.get('pg_restarts', 0)} Postgres restarts; "
            f"caught up in {r['caught_up_s']:g} s, {r.get('reports_behind', 0)} reports past its "
            f"committed offsets then")


TRIAL = OwnTrial(
    "history", "History", TITLE, METHOD, _run,
    ("succeeded: happened / reported / counted",
     "dead-lettered: happened / reported / counted", "succeeded short (allowed)",
     "dead-lettered short (allowed)", "worker kill -9", "history kill -9",
     "Postgres restarts", "caught up s", "reports past its commit",
     "dup effects", "run s", "ok"), _cells, _summary,
    notes="Reported: what the workers' reports on `P._stats` say; the history must count "
          "exactly that. Short: happened minus counted, which only the workers' kills may "
          "cause; allowed: what the killed workers ended in their last 0.75 s. Caught up: "
          "the three views say what the workers reported and stay put 4 s. Reports past "
          "its commit: the history's committed input offsets then, behind what it had "
          "folded (0 expected; they lagged by minutes while faust dropped records).")
