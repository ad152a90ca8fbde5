"""`requeue`: put a job type's dead letters back in their lanes, safe to interrupt and
to run again.

- A requeued job keeps its job ID, so a letter sent twice (an interrupted run done
  again) runs its effects once: `ctx.once()` finds the first run's dedup row.
- `SelectAll` (`dlq requeue T --all`) *drains* through the consumer group `P.T.dlq`:
  from the group's committed position to the end snapshot, letters are sent to their
  lanes a chunk at a time, and the chunk's offsets are committed only after the broker
  acknowledged every record of it. A run killed at any point has committed only letters
  that are in a lane; the next run starts there and re-sends at most one chunk. Every
  letter the drain looks at is committed past, also the ones it leaves (loop guard,
  undecodable, expired, repeats): the group's position means "dealt with, and reported".
- One letter per job: of a job's letters (`stream_jobs.dlq.tally`) after the drain
  position (`--all`) or in the whole DLQ (a selection) only the newest is judged and
  sent; the older ones are *repeats*, skipped and reported.
- `SelectIds` and `SelectReason` never use the group (they commit nothing): they look at
  the whole DLQ, also behind the drain position, which is how a left letter is reached
  later (`--id ID --force`). Repeating a selection sends each job once per run.
- The loop guard: a letter already requeued `max_requeues` times is left (and reported)
  unless forced, so a job that can never succeed does not cycle forever. A letter past
  its expiry is left too (the worker would drop it unrun) unless forced, which clears
  the expiry. A letter that is not a job of the type is always left.
- Attempts: a requeued job runs as the next attempt (`attempt + 1`) and keeps whatever
  attempts its policy has left (none, for a `max-attempts` letter: a failure sends it
  straight back to the DLQ, `sj-requeues` one higher). The worker always runs a job it is
  given, whatever its attempt, so a requeued job runs at least once. `reset_attempts`
  starts it again at attempt 1 with the full retry budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from stream_jobs.clock import now_ms
from stream_jobs.dlq.letters import (
    DEFAULT_MAX_REQUEUES,
    UNKNOWN_REASON,
    Letter,
    Verdict,
    judge,
    read_letter,
    requeued_record,
)
from stream_jobs.dlq.listing import (
    DlqRefused,
    LetterNotFound,
    dlq_spans,
    drain_starts,
    policy_of,
)
from stream_jobs.dlq.pacing import Pacer, chunk_size
from stream_jobs.dlq.tally import LetterTally, job_key
from stream_jobs.errors import CommitRefused, ConfigError, PublishError
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.consumer import Consumer, open_consumer, open_reader
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.kafka.scan import PartitionRange, scan
from stream_jobs.naming import DEFAULT_LANE, dlq_group, dlq_topic, lane_topic
from stream_jobs.plurals import counted
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from stream_jobs.tracing import Hop, job_spans

SAMPLE_IDS = 10  # job IDs a plan names per kind of letter it leaves


@dataclass(frozen=True)
class SelectAll:
    """Every letter after the drain position of the group `P.T.dlq` (which then moves)."""


@dataclass(frozen=True)
class SelectIds:
    """The newest letter of each of these job IDs, anywhere in the DLQ."""

    ids: frozenset[str]


@dataclass(frozen=True)
class SelectReason:
    """The newest letter of each job whose letter has this reason, anywhere in the DLQ."""

    reason: str


Selection = SelectAll | SelectIds | SelectReason
Mode = Literal["all", "ids", "reason"]


@dataclass
class RequeuePlan:
    """What a requeue will do, known before it writes anything.

    `read` letters were looked at; `selected` of them were named by the selection, of
    which `superseded` are repeats: older letters of a job with a newer one (not sent).
    Each job's newest letter has a verdict (`verdicts`); `lanes` splits the requeues by lane;
    `samples` names up to ten job IDs per verdict that leaves letters.
    """

    job_type: str
    topic: str
    mode: Mode
    group: str | None
    read: int = 0
    selected: int = 0
    superseded: int = 0
    verdicts: Counter[Verdict] = field(default_factory=Counter)
    lanes: Counter[str] = field(default_factory=Counter)
    undecodable_reasons: Counter[str] = field(default_factory=Counter)
    samples: dict[Verdict, list[str]] = field(default_factory=dict)
    # Where the work is: partition -> offsets to read; for a selection, the letters to send.
    spans: dict[int, PartitionRange] = field(default_factory=dict)
    chosen: set[tuple[int, int]] = field(default_factory=set)

    @property
    def to_requeue(self) -> int:
        return self.verdicts[Verdict.REQUEUE]

    @property
    def left(self) -> int:
        return sum(n for v, n in self.verdicts.items() if v != Verdict.REQUEUE)

    @property
    def total_work(self) -> int:
        """Units of progress: letters drained (`all`) or letters sent (selections)."""
        return sum(s.size for s in self.spans.values()) if self.mode == "all" \
            else self.to_requeue

    def count(self, verdict: Verdict, lane: str | None, *, label: str,
              problem: str | None) -> None:
        """Tally one letter: its verdict, its lane if requeued, `label` (its job ID) if left."""
        self.verdicts[verdict] += 1
        if verdict == Verdict.REQUEUE and lane is not None:
            self.lanes[lane] += 1
        if verdict == Verdict.UNDECODABLE:
            self.undecodable_reasons[problem or UNKNOWN_REASON] += 1
        if verdict != Verdict.REQUEUE:
            sample = self.samples.setdefault(verdict, [])
            if len(sample) < SAMPLE_IDS:
                sample.append(label)


def _label(letter: Letter) -> str:
    return letter.job_id or f"(no job ID, {letter.partition}/{letter.offset})"


@dataclass(frozen=True)
class RequeueResult:
    """What a requeue did. `requeued` records were acknowledged in lanes; `drained`
    letters were committed past by the group (`all` only)."""

    plan: RequeuePlan
    requeued: int
    drained: int
    dry_run: bool


@dataclass(frozen=True)
class _Options:
    policy: JobTypePolicy
    prefix: str
    payload_limit: int
    force: bool
    max_requeues: int
    reset_attempts: bool

    def verdict(self, letter: Letter, now_ms: int) -> tuple[Verdict, str | None]:
        verdict = judge(letter, force=self.force, max_requeues=self.max_requeues, now_ms=now_ms)
        lane = None
        if verdict == Verdict.REQUEUE and letter.job is not None:
            lane = letter.job.lane if letter.job.lane in self.policy.priorities \
                else DEFAULT_LANE
        return verdict, lane

    def target(self, letter: Letter, now_ms: int) -> tuple[str, JobRecord] | None:
        """The (topic, record) to send for `letter`, or None if it is left."""
        verdict, _ = self.verdict(letter, now_ms)
        if verdict != Verdict.REQUEUE or letter.job is None:
            return None
        lane, record = requeued_record(letter.job, self.policy,
                                       reset_attempts=self.reset_attempts, now_ms=now_ms)
        return lane_topic(self.prefix, self.policy.job_type, lane), record


async def requeue(
    settings: Settings,
    job_type: str,
    *,
    select: Selection,
    reset_attempts: bool = False,
    rate_per_s: float | None = None,
    dry_run: bool = False,
    force: bool = False,
    max_requeues: int = DEFAULT_MAX_REQUEUES,
    on_plan: Callable[[RequeuePlan], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> RequeueResult:
    """Put dead letters back in their lanes (see the module docstring for the guarantees).

    Reads the DLQ once to plan (`on_plan` gets the plan before anything is written), then
    again to send. `on_progress(n)` reports n more units of `plan.total_work` done.
    Raises LetterNotFound, before writing anything, when `SelectIds` names an ID that no
    letter has.
    """
    policy = policy_of(settings, job_type)
    if max_requeues < 0:
        raise ConfigError("max_requeues must be 0 or more.")
    if rate_per_s is not None and not rate_per_s > 0:
        raise ConfigError("A requeue rate must be above zero, e.g. 100/s.")
    options = _Options(policy, settings.topic_prefix, policy.payload_limit(settings), force,
                       max_requeues, reset_attempts)
    if isinstance(select, SelectAll):
        plan = await _plan_drain(settings, options)
    else:
        plan = await _plan_selection(settings, options, select)
    if on_plan is not None:
        on_plan(plan)
    if dry_run or plan.total_work == 0:
        return RequeueResult(plan, 0, 0, dry_run)
    pacer = Pacer(rate_per_s) if rate_per_s is not None else None
    size = chunk_size(rate_per_s)
    progress = on_progress or (lambda _n: None)
    async with JobProducer(settings) as producer:
        if plan.mode == "all":
            requeued, drained = await _drain(settings, options, plan, producer, pacer, size,
                                             progress)
            return RequeueResult(plan, requeued, drained, False)
        requeued = await _send_chosen(settings, options, plan, producer, pacer, size, progress)
    return RequeueResult(plan, requeued, 0, False)


async def _plan_drain(settings: Settings, options: _Options) -> RequeuePlan:
    job_type = options.policy.job_type
    topic = dlq_topic(settings.topic_prefix, job_type)
    group = dlq_group(settings.topic_prefix, job_type)
    plan = RequeuePlan(job_type, topic, "all", group)
    picks = _Picks(now_ms())
    async with open_reader(settings) as consumer:
        whole = await dlq_spans(consumer, topic)
        starts = await drain_starts(settings, job_type, whole)
        plan.spans = {s.partition: PartitionRange(s.partition, starts[s.partition], s.end)
                      for s in whole}
        async for record in scan(consumer, topic, list(plan.spans.values())):
            plan.read += 1
            picks.add(read_letter(record, job_type, options.payload_limit), options)
    picks.settle(plan)
    return plan


async def _plan_selection(settings: Settings, options: _Options,
                          select: SelectIds | SelectReason) -> RequeuePlan:
    job_type = options.policy.job_type
    topic = dlq_topic(settings.topic_prefix, job_type)
    plan = RequeuePlan(job_type, topic, "ids" if isinstance(select, SelectIds) else "reason",
                       None)
    picks = _Picks(now_ms())
    async with open_reader(settings) as consumer:
        whole = await dlq_spans(consumer, topic)
        async for record in scan(consumer, topic, whole):
            letter = read_letter(record, job_type, options.payload_limit)
            plan.read += 1
            if isinstance(select, SelectIds):
                if letter.job_id not in select.ids:
                    continue
            elif letter.reason != select.reason:
                continue
            picks.add(letter, options)
    if isinstance(select, SelectIds):
        missing = sorted(select.ids - picks.tally.jobs.keys())
        if missing:
            raise LetterNotFound(
                f"No letter in {topic} has job ID {', '.join(repr(m) for m in missing[:5])}"
                f"{' and more' if len(missing) > 5 else ''}; nothing was requeued. "
                f"`stream-jobs dlq list {job_type}` shows the IDs it holds.")
    picks.settle(plan)
    plan.spans = _spans_of(plan.chosen)
    return plan


def _spans_of(chosen: set[tuple[int, int]]) -> dict[int, PartitionRange]:
    """Per partition, the offsets from the first to the last chosen letter."""
    offsets: dict[int, list[int]] = {}
    for p, offset in chosen:
        offsets.setdefault(p, []).append(offset)
    return {p: PartitionRange(p, min(o), max(o) + 1) for p, o in sorted(offsets.items())}


@dataclass(frozen=True, slots=True)
class _Pick:
    verdict: Verdict
    lane: str | None
    label: str
    problem: str | None


class _Picks:
    """Selected letters folded per job (`LetterTally`): only each job's newest is judged."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.tally = LetterTally()
        self.judged: dict[str, _Pick] = {}

    def add(self, letter: Letter, options: _Options) -> None:
        if self.tally.add(letter):
            verdict, lane = options.verdict(letter, self.now_ms)
            self.judged[job_key(letter)] = _Pick(verdict, lane, _label(letter), letter.problem)

    def settle(self, plan: RequeuePlan) -> None:
        """Count every job's verdict in `plan` and choose the newest letters to send."""
        counts = self.tally.counts
        plan.selected, plan.superseded = counts.letters, counts.repeats
        for key, job in self.tally.jobs.items():
            pick = self.judged[key]
            plan.count(pick.verdict, pick.lane, label=pick.label, problem=pick.problem)
            if pick.verdict == Verdict.REQUEUE:
                plan.chosen.add(job.position)


async def _send_chosen(settings: Settings, options: _Options, plan: RequeuePlan,
                       producer: JobProducer, pacer: Pacer | None, size: int,
                       progress: Callable[[int], None]) -> int:
    """Send the planned letters of a selection. Commits nothing: the DLQ is unchanged."""
    sent = 0
    batch: list[tuple[str, JobRecord]] = []
    async with open_reader(settings) as consumer:
        async for record in scan(consumer, plan.topic, list(plan.spans.values())):
            if (record.partition, record.offset) not in plan.chosen:
                continue
            letter = read_letter(record, plan.job_type, options.payload_limit)
            target = options.target(letter, now_ms())
            if target is not None:
                batch.append(target)
            if len(batch) >= size:
                sent += await _send(producer, batch, pacer, sent)
                progress(len(batch))
                batch = []
        if batch:
            sent += await _send(producer, batch, pacer, sent)
            progress(len(batch))
    return sent


async def _drain(settings: Settings, options: _Options, plan: RequeuePlan,
                 producer: JobProducer, pacer: Pacer | None, size: int,
                 progress: Callable[[int], None]) -> tuple[int, int]:
    """Requeue from the group's position to the planned ends, committing each chunk only
    after its records are acknowledged. Returns (records sent, letters committed past)."""
    assert plan.group is not None
    sent = drained = 0
    async with open_consumer(settings, group_id=plan.group, enable_auto_commit=False,
                             auto_offset_reset="earliest",
                             max_partition_fetch_bytes=settings.max_payload_bytes * 2
                             ) as consumer:
        for span in plan.spans.values():
            tp = TopicPartition(plan.topic, span.partition)
            consumer.assign([tp])
            committed = await consumer.committed(tp)
            first = (await consumer.beginning_offsets([tp]))[tp]
            position = max(first, committed or 0)
            if position >= span.end:
                continue
            consumer.seek(tp, position)
            while position < span.end:
                fetched = await consumer.getmany(tp, timeout_ms=10_000, max_records=size)
                if not fetched:
                    raise DlqRefused(f"{plan.topic} partition {span.partition} returned "
                                     "nothing for 10 s before the end of the requeue; is "
                                     "the broker healthy? Run the same command again.")
                records = [r for r in fetched.get(tp, []) if r.offset < span.end]
                now = now_ms()
                letters = [read_letter(r, plan.job_type, options.payload_limit)
                           for r in records]
                targets = [t for t in (options.target(letter, now) for letter in letters
                                       if (letter.partition, letter.offset) in plan.chosen)
                           if t is not None]
                if targets:
                    sent += await _send(producer, targets, pacer, sent)
                after = min(await consumer.position(tp), span.end)
                await _commit(consumer, tp, after, sent)
                drained += after - position
                progress(after - position)
                position = after
    return sent, drained


async def _send(producer: JobProducer, batch: list[tuple[str, JobRecord]],
                pacer: Pacer | None, sent_before: int) -> int:
    if pacer is not None:
        await pacer.take(len(batch))
    spans = job_spans()  # a requeue continues each job's trace, if traced
    try:
        if spans is None:
            await producer.send_many(batch)
        else:
            await spans.send_many(producer.send_many, batch, Hop.REQUEUE)
    except PublishError as exc:
        raise PublishError(f"{exc}. {counted(sent_before, 'letter was', 'letters were')} "
                           "requeued before this and the "
                           "rest are still in the DLQ: run the same command again to go on "
                           "(letters sent twice keep their job IDs and ctx.once() runs "
                           "them once).") from exc
    return len(batch)


async def _commit(consumer: Consumer, tp: TopicPartition, offset: int, sent: int) -> None:
    try:
        await consumer.commit({tp: offset})
    except CommitRefused as exc:
        raise DlqRefused(f"Kafka did not take the drain position of {tp.topic} partition "
                         f"{tp.partition} ({exc}); {counted(sent, 'letter was', 'letters were')}"
                         " requeued. Run the "
                         "same command again: it starts from the last position taken and "
                         "letters sent twice run once (ctx.once()).") from exc


__all__ = [
    "DEFAULT_MAX_REQUEUES",
    "RequeuePlan",
    "RequeueResult",
    "SelectAll",
    "SelectIds",
    "SelectReason",
    "Selection",
    "chunk_size",
    "requeue",
]
