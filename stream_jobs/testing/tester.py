"""`JobTester`: an app's handlers tested without a broker, on its real job path.

```python
async with JobTester(app) as t:
    job_id = await t.enqueue("email.send", {"to": "a@b.c", "subject": "hi"})
    await t.run_until_idle()          # retries and delays included: the clock jumps
    assert t.outcomes == {"succeeded": 1}
    assert t.effects_of(job_id)[0].args == (job_id, "a@b.c")
```

What runs is what `stream-jobs worker` runs: a `Worker` per handled type, with its relay,
on an in-memory broker (`memory_kafka`) through the `KafkaClients` seam; decoding, model
validation, ordering, timeouts, the retry decision, the tiers, dead letters with their
reasons and expiry are the runtime's own code. Time is virtual (`virtual_time`): nothing
runs between calls, and the clock moves only in `run_until_idle` (to each held record's
due time) and `advance` (to a given time, firing schedules on the way). `ctx.once()` keeps
its promise in memory (`memory_dedup`), or on a real Postgres with `database_url=`, where
the transactional outbox and its relay are the real ones too.

Cancels, unique and debounced enqueues, kept results, chains and batches work in memory
as well (`memory_control`, `memory_tables`): the workers' cancel feed and key store, the
finish transaction's store and the clients' stores are in-memory ones behind the seams
the runtime has for them, so the outcomes and counts are the runtime's own.

While a tester is open, the app's own clients (`app.client()`, `app.sync_client()`)
enqueue into it, and `stream_jobs.clock` reads its clock; one tester at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from pydantic import BaseModel

from stream_jobs import clock
from stream_jobs.app import App
from stream_jobs.cancels.rules import Cancellation
from stream_jobs.client import Job, JobClient
from stream_jobs.dlq.letters import Letter, read_letter
from stream_jobs.errors import ConfigError, LetterNotFound
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka.clients import KafkaClients
from stream_jobs.kafka.producer import Written
from stream_jobs.lookup import JobLocation
from stream_jobs.naming import parse_topic, stats_topic
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.postgres.migrate import prepare_schema
from stream_jobs.record import HEADER_ATTEMPT, HEADER_JOB_ID
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from stream_jobs.storage import PostgresStorage, Storage
from stream_jobs.testing.broker import MemoryBroker, StoredRecord
from stream_jobs.testing.memory_control import MemoryStores
from stream_jobs.testing.memory_dedup import DoneRow, MemoryDedup, Statement, TesterTransaction
from stream_jobs.testing.memory_kafka import MemoryKafka, MemoryProducer
from stream_jobs.testing.memory_storage import MemoryStorage
from stream_jobs.testing.memory_tables import RawRecord
from stream_jobs.testing.runs import WorkerRun
from stream_jobs.testing.schedules import Firing, VirtualSchedules
from stream_jobs.testing.virtual_time import VirtualClock, start_ms_of

TypeDeclaration = JobTypePolicy | Mapping[str, object]


class JobTester:
    """The harness (see the module). Open it with `async with`, `with`, or `open()`."""

    def __init__(self, app: App, *, types: Mapping[str, TypeDeclaration] | None = None,
                 database_url: str | None = None, database_schema: str | None = None,
                 start: datetime | None = None, timeout_s: float = 60.0) -> None:
        """`types`: the job types (a policy, or the keys of a topics/T.toml), instead of
        the app's topics/. `database_url` (and `database_schema`): `ctx.once()` on that
        Postgres instead of in memory. `start`: where the virtual clock starts (default:
        now). `timeout_s`: how long one run may take in real time before `NotSettled`."""
        if not app.handlers:
            raise ConfigError("This app has no handlers: register one with @app.job(...) "
                              "before testing it.")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be above 0, not {timeout_s:g}.")
        self.app = app
        update: dict[str, object] = {}
        if database_url is not None:
            update["database_url"] = database_url
        if database_schema is not None:
            update["database_schema"] = database_schema
        self.settings: Settings = app.settings.model_copy(update=update)
        self.on_postgres = database_url is not None
        self._types = _declared(app, types)
        self._in_code = types is not None
        missing = sorted(set(app.handlers) - set(self._types))
        if missing:
            raise ConfigError(f"Job type {missing[0]!r} has a handler but is not declared: "
                              f"add topics/{missing[0]}.toml, or pass it in types=.")
        self.broker = MemoryBroker()
        self._kafka = MemoryKafka(self.broker)
        self._writer = MemoryProducer(self.broker, self.settings)
        self._memory = MemoryDedup(self.settings.database_schema, self._publish)
        self.clock = VirtualClock(start_ms_of(start, clock.now_ms()))
        self._timeout_s = timeout_s
        self._running = False
        # On Postgres the clients use its tables; in memory, the tester's rows.
        # In memory, the tester's rows in the app's place; on Postgres, its tables.
        self._memory_storage: MemoryStorage | None = None if self.on_postgres else MemoryStorage(
            self._memory, MemoryStores(self.settings, self._memory.tables, self.broker,
                                       self._publish, lambda: self._running))
        self._storage: Storage = self._memory_storage or PostgresStorage(self.settings)
        self._client = self._new_client()
        self._schedules: VirtualSchedules | None = None
        self._outcomes: dict[str, Counter[str]] = {t: Counter() for t in app.handlers}
        self._reasons: dict[str, Counter[str]] = {t: Counter() for t in app.handlers}
        self._restore: tuple[AbstractContextManager[None], KafkaClients,
                             dict[str, JobTypePolicy] | None, Storage | None] | None = None
        self._entered = False
        self._migrated = False

    # -- opening and closing ------------------------------------------------------------------

    def open(self) -> JobTester:
        """Start: the topics made, the app's clients (and with `types=`, its types) and
        the clock pointed at the tester."""
        if self._restore is not None:
            return self
        # What can refuse (a schedule's payload, a clock already taken) comes first, so a
        # refusal leaves the app and the clock as they were.
        schedules = VirtualSchedules(self.app, self._types, self._kafka, self.clock.now_ms())
        reading = clock.reading(self.clock)
        reading.__enter__()
        self._restore = (reading, self.app.kafka, self.app.declared_types,
                         self.app.use_storage(self._memory_storage))
        self.app.kafka = self._kafka
        if self._in_code:
            self.app.declared_types = dict(self._types)
        prefix = self.settings.topic_prefix
        for policy in self._types.values():
            for spec in policy.all_topics(prefix):
                self.broker.create_topic(spec.name, spec.partitions)
        self.broker.create_topic(stats_topic(prefix), 1)
        self._schedules = schedules
        return self

    def close(self) -> None:
        """Give the app its clients and the process its clock back (nothing runs between
        calls, so nothing needs stopping)."""
        if self._restore is None:
            return
        reading, kafka, declared, stores = self._restore
        self._restore = None
        self.app.kafka, self.app.declared_types = kafka, declared
        self.app.use_storage(stores)
        reading.__exit__(None, None, None)

    def __enter__(self) -> JobTester:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> JobTester:
        return self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _opened(self) -> VirtualSchedules:
        if self._schedules is None or self._restore is None:
            raise ConfigError("Open the JobTester first: `async with JobTester(app) as t:` "
                              "(or the job_tester fixture).")
        return self._schedules

    # -- what goes in ---------------------------------------------------------------------------

    async def _entered_client(self) -> JobClient:
        self._opened()
        if not self._entered:
            await self._client.__aenter__()
            self._entered = True
        if self.on_postgres and not self._migrated:
            # Before the first enqueue: `enqueue(conn=...)` needs the outbox table.
            await prepare_schema(self.settings)
            self._migrated = True
        return self._client

    async def enqueue(self, job_type: str, payload: BaseModel | Mapping[str, Any],
                      **options: Any) -> str:
        """`JobClient.enqueue` into the tester (same options, checks and errors)."""
        client = await self._entered_client()
        job_id: str = await client.enqueue(job_type, payload, **options)
        return job_id

    async def enqueue_many(self, jobs: Iterable[Job], *, conn: Any = None) -> list[str]:
        """`JobClient.enqueue_many` into the tester."""
        return await (await self._entered_client()).enqueue_many(jobs, conn=conn)

    def send_raw(self, job_type: str, value: bytes | None, *, key: bytes | None = None,
                 headers: Sequence[tuple[str, bytes]] = (), lane: str = "default") -> Written:
        """Write bytes as they are to a lane of `job_type` (a record no client would make:
        bad JSON, missing headers), as another Kafka producer could."""
        self._opened()
        policy = get_job_type(self._types, job_type)
        topic = policy.lane_topics(self.settings.topic_prefix).get(lane)
        if topic is None:
            raise ConfigError(f"Job type {job_type!r} has no {lane!r} lane; it declares "
                              f"{', '.join(policy.priorities)}.")
        return self._writer.write(topic, key, value, headers)

    def transaction(self) -> TesterTransaction:
        """A stand-in for your database transaction, for `enqueue(conn=...)`: `async with
        t.transaction() as conn:` (or `with`); its jobs are written when the block ends
        without an error, and not at all otherwise."""
        self._opened()
        return TesterTransaction(self._publish, self._memory.tables)

    def _publish(self, records: Sequence[RawRecord]) -> None:
        for topic, key, value, headers in records:
            self._writer.write(topic, key, value, headers)

    # -- running --------------------------------------------------------------------------------

    async def run_until_idle(self, *, jump: bool = True) -> None:
        """Run until nothing is left to do: every job run, retried or dead-lettered. With
        `jump` the clock moves to each record a delay tier holds (retries, `delay=`) as it
        comes due; without it, only what is due now runs."""
        await self._run(None if jump else self.clock.now_ms())

    async def advance(self, seconds: float | timedelta) -> None:
        """Move the clock `seconds` forward, running everything that comes due on the way
        in order: held records, schedule firings, expiries."""
        step = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        if step < 0:
            raise ConfigError(f"advance() moves time forward, not by {step:g} s.")
        await self._run(self.clock.now_ms() + round(step * 1000))

    def move_clock(self, seconds: float | timedelta) -> None:
        """Move the clock `seconds` forward with no worker running, as through an outage:
        what comes due meanwhile runs late, on the next run; what expires is `expired`;
        a schedule's missed firings go by its `missed` policy."""
        step = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        if step < 0:
            raise ConfigError(f"move_clock() moves time forward, not by {step:g} s.")
        self._opened()
        self.clock.move_to(self.clock.now_ms() + round(step * 1000))

    async def _run(self, until_ms: int | None) -> None:
        schedules = self._opened()
        client = await self._entered_client()
        outbox = await self._outbox_for_run()
        workers = [self._worker(job_type) for job_type in sorted(self.app.handlers)]
        self._running = True
        try:
            async with WorkerRun(workers, self._kafka, self.clock, schedules, client,
                                 outbox=outbox, timeout_s=self._timeout_s) as run:
                await schedules.fire_due(self.clock.now_ms(), client)
                await run.settle(until_ms)
        finally:
            self._running = False
            for worker in workers:
                self._outcomes[worker.policy.job_type].update(worker.outcomes)
                self._reasons[worker.policy.job_type].update(worker.dead_letter_reasons)
            if outbox is not None:
                await outbox.close()

    async def _outbox_for_run(self) -> OutboxRelay | None:
        """On Postgres, the relay of the rows `enqueue(conn=)` wrote; in memory, none (the
        tester's rows reach its broker at commit)."""
        if not self.on_postgres:
            return None
        relay = OutboxRelay(self.settings, producer=self._writer)
        await relay.connect()
        return relay

    def _new_client(self) -> JobClient:
        return JobClient(self.settings, self._types, models=self.app.models(),
                         kafka=self._kafka, kept=self.app.kept_results(),
                         stores=self._storage.client_stores())

    def _worker(self, job_type: str) -> Worker:
        return Worker(self.settings, self._types[job_type], self.app.handler(job_type),
                      storage=self._storage, kafka=self._kafka, children=self._new_client(),
                      control=False, grace_s=1.0)

    # -- cancels, results, workflows (the client's calls, into the tester) ----------------------

    async def cancel(self, job_id: str, *, job_type: str | None = None,
                     reason: str | None = None) -> Cancellation:
        """`JobClient.cancel`: the job never starts, a run in progress is interrupted."""
        return await (await self._entered_client()).cancel(job_id, job_type=job_type,
                                                            reason=reason)

    async def result(self, job_id: str, *, timeout: float = 30.0,  # noqa: ASYNC109
                     model: type[BaseModel] | None = None) -> Any:
        """`JobClient.result`; in memory it waits only while a run is going on."""
        return await (await self._entered_client()).result(job_id, timeout=timeout,
                                                            model=model)

    async def status(self, job_id: str, *, job_type: str | None = None) -> JobLocation:
        """`JobClient.status`: where the job is, from the tester's rows and topics."""
        return await (await self._entered_client()).status(job_id, job_type=job_type)

    async def chain(self, *jobs: Job, chain_id: str | None = None, conn: Any = None) -> str:
        """`JobClient.chain` into the tester."""
        return await (await self._entered_client()).chain(*jobs, chain_id=chain_id, conn=conn)

    async def batch(self, jobs: Iterable[Job], *, on_success: Job | None = None,
                    on_complete: Job | None = None, batch_id: str | None = None,
                    conn: Any = None) -> str:
        """`JobClient.batch` into the tester."""
        return await (await self._entered_client()).batch(
            jobs, on_success=on_success, on_complete=on_complete, batch_id=batch_id, conn=conn)

    # -- what came out --------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """The virtual clock (UTC)."""
        return self.clock.now

    @property
    def outcomes(self) -> Counter[str]:
        """Every type's outcomes so far, as a worker counts them (`succeeded`, `retried`,
        `dead_lettered`, `expired`, `duplicate`, `cancelled`, `superseded`)."""
        return _summed(self._outcomes.values())

    def outcomes_of(self, job_type: str) -> Counter[str]:
        return _summed([self._outcomes.get(job_type, Counter())])

    @property
    def dead_letter_reasons(self) -> Counter[str]:
        """Dead letters per reason (`permanent`, `max-attempts`, `bad-json`, ...)."""
        return _summed(self._reasons.values())

    @property
    def dead_letters(self) -> list[Letter]:
        """Every dead letter, as `stream-jobs dlq show` reads them, oldest first."""
        prefix = self.settings.topic_prefix
        letters = []
        for policy in self._types.values():
            limit = policy.payload_limit(self.settings)
            for record in self.broker.records(policy.dlq_topic(prefix)):
                letters.append(read_letter(record, policy.job_type, limit))
        return sorted(letters, key=lambda letter: (letter.timestamp_ms, letter.offset))

    def letter_of(self, job_id: str) -> Letter:
        """The newest dead letter of `job_id`; LetterNotFound if it has none."""
        found = [letter for letter in self.dead_letters if letter.job_id == job_id]
        if not found:
            raise LetterNotFound(f"Job {job_id} has no dead letter.")
        return max(found, key=lambda letter: letter.rank)

    def records_of(self, job_id: str) -> list[StoredRecord]:
        """Every record that carried `job_id` (lanes, tiers, DLQ), in the order written."""
        found = [record for topic in self.broker.topics() for record in
                 self.broker.records(topic) if record.header(HEADER_JOB_ID) == job_id.encode()]
        return sorted(found, key=lambda record: record.timestamp)

    def attempts_of(self, job_id: str) -> int:
        """How many attempts `job_id` was given in its lanes (0: none reached a lane)."""
        prefix = self.settings.topic_prefix
        attempts = [int(record.header(HEADER_ATTEMPT) or b"1")
                    for record in self.records_of(job_id)
                    if parse_topic(prefix, record.topic).role == "lane"]
        return max(attempts, default=0)

    def effects_of(self, job_id: str) -> list[Statement]:
        """The statements job `job_id` committed through `ctx.once()` (or recorded in
        `ctx.once_deferred()`), in order; [] if it committed none."""
        if self.on_postgres:
            raise ConfigError("effects_of() reads the in-memory dedup store; on Postgres "
                              "the effects are in your tables: query them.")
        return list(self._memory.effects.get(job_id, ()))

    @property
    def done(self) -> Mapping[str, DoneRow]:
        """The in-memory dedup rows: job ID -> the attempt that committed, and when."""
        return dict(self._memory.done)

    @property
    def fired(self) -> list[Firing]:
        """The schedule firings enqueued so far."""
        return list(self._opened().fired)


def _summed(counters: Iterable[Counter[str]]) -> Counter[str]:
    # Workers count by StrEnum; plain strings print and compare more simply in a test.
    total: Counter[str] = Counter()
    for found in counters:
        total.update({str(name): n for name, n in found.items() if n})
    return total


def _declared(app: App, types: Mapping[str, TypeDeclaration] | None) -> dict[str, JobTypePolicy]:
    if types is None:
        return app.job_types()
    found = {}
    for name, declared in types.items():
        policy = (declared if isinstance(declared, JobTypePolicy)
                  else JobTypePolicy.from_toml(declared, job_type=name,
                                               source=f"JobTester(types={{{name!r}: ...}})"))
        if policy.job_type != name:
            raise ConfigError(f"types={{{name!r}: ...}} holds the policy of "
                              f"{policy.job_type!r}.")
        found[name] = policy
    return found


__all__ = ["JobTester", "TypeDeclaration"]
