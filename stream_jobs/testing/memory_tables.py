"""The Postgres rows of cancels, unique keys, debounce, results and workflows, in memory.

On Postgres these live in tables the runtime writes with its own statements: a cancel's
transaction (`stream_jobs.cancels.store`), a key's claim (`stream_jobs.unique.claim`),
the finish statements (`stream_jobs.workflows.sql`) and a workflow's plan
(`stream_jobs.workflows.create`). `MemoryTables` keeps the same rows and gives the same
answers, so the real worker, relay, finish and client code run on it unchanged: the
runtime's statements reach `apply` as they would reach Postgres (recognised by their
text, built by the same functions for the tester's schema) and each is carried out here
as its SQL says. A statement it does not know is one of the handler's own: an effect.

Time is the tester's virtual clock. Everything happens under one lock, as one transaction
at a time, so two runs meeting on a job ID or a batch's counters serialise as on Postgres.
A run inside `ctx.once()` holds its job's claim (`claims`) as its open transaction holds
the dedup row's lock: a cancel waits for it, asking for an interrupt, as on Postgres.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from stream_jobs import clock
from stream_jobs.cancels.rules import (
    MARKER_ATTEMPT,
    CancelAnswer,
    Cancellation,
    checked_reason,
    concerns,
)
from stream_jobs.errors import AlreadyDone, ConfigError, UnknownStatement
from stream_jobs.outbox.rows import decode_headers
from stream_jobs.postgres.names import (
    MEMBER_ENDED,
    MEMBER_SUCCEEDED,
    OUTBOX_INSERT,
    RESULT_ENDED,
    RESULT_SUCCEEDED,
    WORKFLOW_INSERT,
    WORKFLOW_STEPS,
    statement_name,
)
from stream_jobs.record import HEADER_ENQUEUED_AT, HEADER_EXPIRES_AT
from stream_jobs.results.rules import StoredResult
from stream_jobs.unique.claim import KeyAnswer
from stream_jobs.unique.rules import KeyClaim
from stream_jobs.workflows.members import SUMMARY_KEY

# (topic, key, value, headers): a record to write once its transaction commits.
RawRecord = tuple[str, bytes | None, bytes | None, Sequence[tuple[str, bytes]]]
Listener = Callable[[str, str], None]  # (job type or "", job ID)


@dataclass(frozen=True)
class DoneRow:
    """A committed dedup row: the attempt that committed it, and when (virtual Unix ms).
    Attempt 0 is a cancel's marker: no run committed it."""

    job_type: str
    attempt: int
    finished_at_ms: int


@dataclass
class Workflow:
    """A row of `stream_jobs_workflows` and its templates (slot -> record to write)."""

    kind: str
    total: int
    parent_job_id: str | None
    created_ms: int
    finished_ms: int | None
    succeeded: int = 0
    failed: int = 0
    failed_step: int | None = None
    failure: str | None = None
    templates: tuple[tuple[str, str, RawRecord, int | None], ...] = ()  # slot, ID, record, ttl


@dataclass
class _Key:
    job_id: str
    held_until_ms: int | None
    finished_ms: int | None = None

    def free(self, now: int) -> bool:
        return self.finished_ms is not None and (self.held_until_ms is None
                                                 or self.held_until_ms <= now)


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class MemoryTables:
    """The rows (see the module). `done` is the dedup table `MemoryDedup` claims in."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.lock = threading.RLock()
        self.done: dict[str, DoneRow] = {}
        self.cancels: dict[str, tuple[str, str | None, int]] = {}  # ID -> type, reason, when
        self.unique: dict[tuple[str, str], _Key] = {}
        self.debounce: dict[tuple[str, str], tuple[str, int]] = {}  # -> job ID, window end
        self.superseded: dict[str, str] = {}  # job ID -> the job that replaced it
        self.results: dict[str, StoredResult] = {}
        self.workflows: dict[str, Workflow] = {}
        # Runs inside ctx.once() now, by job ID, and the cancels waiting for them to end.
        self.claims: dict[str, int] = {}
        self._claim_waiters: dict[str, list[Callable[[], None]]] = {}
        self._interrupt_listeners: list[Listener] = []
        self._cancel_listeners: list[Listener] = []
        self._result_listeners: list[Callable[[], None]] = []
        # The runtime's own statements, by name (stream_jobs.postgres.names); any other
        # statement is a handler's effect, recorded as it was run.
        self._apply: dict[str, Callable[[tuple[Any, ...], list[RawRecord]], None]] = {
            RESULT_SUCCEEDED: self._succeeded, RESULT_ENDED: self._terminal,
            MEMBER_SUCCEEDED: self._member_succeeded, MEMBER_ENDED: self._member_ended,
            WORKFLOW_INSERT: self._workflow, WORKFLOW_STEPS: self._templates,
            OUTBOX_INSERT: _outbox_rows}
        self._finishes = {RESULT_SUCCEEDED, RESULT_ENDED, MEMBER_SUCCEEDED, MEMBER_ENDED}

    def on_cancel(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(type, job_id)` after each cancel commits; returns the unsubscribe."""
        self._cancel_listeners.append(listener)
        return lambda: self._cancel_listeners.remove(listener)

    def on_interrupt(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(type, job_id)` when a cancel waits on a run's open claim."""
        self._interrupt_listeners.append(listener)
        return lambda: self._interrupt_listeners.remove(listener)

    def on_result(self, listener: Callable[[], None]) -> Callable[[], None]:
        self._result_listeners.append(listener)
        return lambda: self._result_listeners.remove(listener)

    # -- statements -----------------------------------------------------------------------

    def _applier(self, sql: str) -> Callable[[tuple[Any, ...], list[RawRecord]], None] | None:
        """How to apply `sql` if it is the runtime's (None: a handler's effect);
        `UnknownStatement` for one of the runtime's these tables do not know."""
        name = statement_name(sql)
        if name is None:
            return None
        apply = self._apply.get(name)
        if apply is None:
            raise UnknownStatement(f"The in-memory tables cannot apply the runtime's statement "
                                   f"{name!r}: add it to stream_jobs.testing.memory_tables.")
        return apply

    def commit(self, job: tuple[str, str, int] | None, statements: Sequence[tuple[str, Any]]
               ) -> tuple[list[tuple[str, tuple[Any, ...]]], list[RawRecord]]:
        """One transaction: the dedup row of `job` (job ID, type, attempt) if given, then
        `statements`; the handler's own statements among them and the records to write.
        `AlreadyDone` when the job's row exists, and then nothing is applied."""
        effects: list[tuple[str, tuple[Any, ...]]] = []
        rows: list[RawRecord] = []
        with self.lock:
            if job is not None:
                job_id, job_type, attempt = job
                if job_id in self.done:
                    raise AlreadyDone(f"job {job_id} already finished")
            # Checked before anything changes, so a refused plan leaves no row behind.
            appliers = [self._applier(sql) for sql, _ in statements]
            for sql, args in statements:
                if statement_name(sql) == WORKFLOW_INSERT and args[0] in self.workflows:
                    raise ConfigError(f"A batch or chain with the ID {args[0]!r} exists "
                                      "already: give a new ID, or none.")
            if job is not None:
                self.done[job_id] = DoneRow(job_type, attempt, clock.now_ms())
            for (sql, args), apply in zip(statements, appliers, strict=True):
                if apply is None:
                    effects.append((sql, tuple(args)))
                else:
                    apply(tuple(args), rows)
        if any(statement_name(sql) in self._finishes for sql, _ in statements):
            for listener in list(self._result_listeners):
                listener()  # a result's waiters look again
        return effects, rows

    def _upsert_succeeded(self, args: tuple[Any, ...]) -> bool | None:
        """Part 1 of a success: None when nothing changed, else whether the row is new."""
        job_id, job_type, attempt, result, keep_s = args[:5]
        found = self.results.get(job_id)
        if found is not None and found.succeeded:
            return None
        now = clock.now_ms()
        self.results[job_id] = StoredResult(job_id, job_type, "succeeded", result, None,
                                            int(attempt), at(now), at(now + _ms(keep_s)))
        return found is None

    def _insert_terminal(self, args: tuple[Any, ...]) -> bool:
        job_id, job_type, attempt, reason, keep_s, _channel, state = args[:7]
        done = self.done.get(job_id)
        if (done is not None and done.attempt != MARKER_ATTEMPT) or job_id in self.results:
            return False
        cancel = self.cancels.get(job_id)
        if state == "cancelled" and cancel is not None and cancel[1] is not None:
            reason = f"cancelled: {cancel[1]}"
        now = clock.now_ms()
        self.results[job_id] = StoredResult(job_id, job_type, state, None, reason,
                                            int(attempt), at(now), at(now + _ms(keep_s)))
        return True

    def _succeeded(self, args: tuple[Any, ...], rows: list[RawRecord]) -> None:
        self._upsert_succeeded(args)

    def _terminal(self, args: tuple[Any, ...], rows: list[RawRecord]) -> None:
        self._insert_terminal(args)

    def _member_succeeded(self, args: tuple[Any, ...], rows: list[RawRecord]) -> None:
        fresh = self._upsert_succeeded(args)
        w = self.workflows.get(args[6])
        if fresh is None or w is None:
            return
        undo, now, step = (0 if fresh else 1), clock.now_ms(), int(args[7])
        if w.kind == "chain":
            w.failed_step, w.failure = None, None
            w.finished_ms = now if w.succeeded + 1 >= w.total else None
        elif w.finished_ms is None and w.succeeded + 1 + w.failed - undo >= w.total:
            w.finished_ms = now
        w.succeeded += 1
        w.failed -= undo
        if w.kind == "chain":
            self._send(args[6], w, {str(step + 1)}, rows)
        else:
            due = {"on_success"} if w.succeeded == w.total else set()
            if fresh and w.succeeded + w.failed == w.total:
                due.add("on_complete")
            self._send(args[6], w, due, rows)

    def _member_ended(self, args: tuple[Any, ...], rows: list[RawRecord]) -> None:
        inserted = self._insert_terminal(args)
        w = self.workflows.get(args[7])
        if not inserted or w is None:
            return
        if w.kind == "chain":
            w.failed_step, w.failure = int(args[8]), args[3]
        if w.finished_ms is None and (w.kind == "chain" or w.succeeded + w.failed + 1 >= w.total):
            w.finished_ms = clock.now_ms()
        w.failed += 1
        if w.kind == "batch" and w.succeeded + w.failed == w.total:
            self._send(args[7], w, {"on_complete"}, rows)

    def _send(self, workflow_id: str, w: Workflow, slots: set[str],
              rows: list[RawRecord]) -> None:
        """The templates of `slots`, stamped now (a batch's callback gets the counts)."""
        now = clock.now_ms()
        for slot, _job_id, (topic, key, value, headers), ttl in sorted(w.templates):
            if slot not in slots:
                continue
            if w.kind == "batch" and value is not None:
                payload = orjson.loads(value)
                payload[SUMMARY_KEY] = {"id": workflow_id, "total": w.total,
                                        "succeeded": w.succeeded, "failed": w.failed}
                value = orjson.dumps(payload)
            stamped = [*headers, (HEADER_ENQUEUED_AT, str(now).encode())]
            if ttl is not None:
                stamped.append((HEADER_EXPIRES_AT, str(now + ttl).encode()))
            rows.append((topic, key, value, tuple(stamped)))

    def _workflow(self, args: tuple[Any, ...], rows: list[RawRecord]) -> None:
        workflow_id, kind, total, parent, finished = args
        now = clock.now_ms()
        self.workflows[workflow_id] = Workflow(kind, int(total), parent, now,
                                               now if finished else None)

    def _templates(self, args: tuple[Any, ...], rows: list[RawRecord]) -> None:
        workflow_id, slots, ids, _types, topics, keys, values, headers, ttls = args
        found = self.workflows[workflow_id]
        found.templates = (*found.templates, *(
            (slot, job_id, (topic, key, value, decode_headers(pairs)), ttl)
            for slot, job_id, topic, key, value, pairs, ttl
            in zip(slots, ids, topics, keys, values, headers, ttls, strict=True)))

    # -- claims ---------------------------------------------------------------------------

    def claim(self, job_id: str) -> None:
        """A run opened its transaction on `job_id`'s row (`release` ends it)."""
        with self.lock:
            self.claims[job_id] = self.claims.get(job_id, 0) + 1

    def release(self, job_id: str) -> None:
        with self.lock:
            left = self.claims.get(job_id, 1) - 1
            if left > 0:
                self.claims[job_id] = left
                return
            self.claims.pop(job_id, None)
            waiters = self._claim_waiters.pop(job_id, [])
        for wake in waiters:
            wake()

    def when_released(self, job_id: str, wake: Callable[[], None]) -> bool:
        """Call `wake()` once no run holds `job_id`'s claim; False if none does now."""
        with self.lock:
            if job_id not in self.claims:
                return False
            self._claim_waiters.setdefault(job_id, []).append(wake)
            return True

    def ask_interrupt(self, job_type: str, job_id: str) -> None:
        for listener in list(self._interrupt_listeners):
            listener(job_type, job_id)

    # -- cancels --------------------------------------------------------------------------

    def cancel(self, job_id: str, job_type: str | None, reason: str | None
               ) -> Cancellation | None:
        """`CancelStore.cancel`'s transaction: the marker, unless the job's row exists;
        None (nothing written) while a run holds the job's claim."""
        stored_reason = checked_reason(reason)
        own_type = job_type or ""
        with self.lock:
            if job_id in self.claims:
                return None
            done = self.done.get(job_id)
            if done is not None:
                return self._earlier(job_id, done)
            now = clock.now_ms()
            self.done[job_id] = DoneRow(own_type, MARKER_ATTEMPT, now)
            self.cancels[job_id] = (own_type, stored_reason, now)
            for found in self.unique.values():
                if found.job_id == job_id and found.finished_ms is None:
                    found.finished_ms = now
        for listener in list(self._cancel_listeners):
            listener(own_type, job_id)
        return Cancellation(job_id, CancelAnswer.CANCELLED, job_type, stored_reason)

    def _earlier(self, job_id: str, done: DoneRow) -> Cancellation:
        cancel = self.cancels.get(job_id)
        if cancel is not None:
            detail = f"Reason given then: {cancel[1]}." if cancel[1] else ""
            return Cancellation(job_id, CancelAnswer.ALREADY_CANCELLED, cancel[0] or None,
                                cancel[1], detail)
        when = at(done.finished_at_ms).isoformat(timespec="seconds")
        return Cancellation(job_id, CancelAnswer.ALREADY_FINISHED, done.job_type or None,
                            detail=f"Attempt {done.attempt} committed its effects at {when}.")

    def cancelled_ids(self, job_type: str) -> set[str]:
        with self.lock:
            return {i for i, (t, _, _) in self.cancels.items() if concerns(t, job_type)}

    # -- unique keys and debounce ---------------------------------------------------------

    def take_key(self, claim: KeyClaim, job_type: str, job_id: str,
                 undo: list[Callable[[], None]] | None = None) -> KeyAnswer:
        """`stream_jobs.unique.claim`'s statement: hold the key, or join its window.
        With `undo`, what puts the rows back as they were is added to it (a rollback)."""
        now = clock.now_ms()
        window = None if claim.window_s is None else round(claim.window_s * 1000)
        with self.lock:
            if undo is not None:
                undo.append(self._restorer(claim, job_type))
            if claim.kind == "unique":
                found = self.unique.get((job_type, claim.key))
                if found is None or found.free(now):
                    held = None if window is None else now + window
                    self.unique[(job_type, claim.key)] = _Key(job_id, held)
                    return KeyAnswer(job_id, True)
                return KeyAnswer(found.job_id, False)  # held (even by this ID, enqueued before)
            assert window is not None  # a debounce always has its window
            replaced: str | None = None
            ends = now + window
            opened = self.debounce.get((job_type, claim.key))
            if opened is not None and opened[1] > now:
                ends = opened[1]
                if opened[0] != job_id:
                    replaced = opened[0]
                    self.superseded.setdefault(replaced, job_id)
            self.debounce[(job_type, claim.key)] = (job_id, ends)
            return KeyAnswer(job_id, True, replaced, ends)

    def _restorer(self, claim: KeyClaim, job_type: str) -> Callable[[], None]:
        slot = (job_type, claim.key)
        held, window = self.unique.get(slot), self.debounce.get(slot)
        held = None if held is None else _Key(held.job_id, held.held_until_ms, held.finished_ms)
        marks = dict(self.superseded)

        def restore() -> None:
            with self.lock:
                self.unique.pop(slot, None)
                self.debounce.pop(slot, None)
                if held is not None:
                    self.unique[slot] = held
                if window is not None:
                    self.debounce[slot] = window
                self.superseded = marks

        return restore

    def release_key(self, job_type: str, unique_key: str, job_id: str) -> None:
        """`RELEASE_UNIQUE` for one job: its key goes, or its window alone holds it."""
        now = clock.now_ms()
        with self.lock:
            found = self.unique.get((job_type, unique_key))
            if found is None or found.job_id != job_id:
                return
            if found.held_until_ms is None or found.held_until_ms <= now:
                del self.unique[(job_type, unique_key)]
            elif found.finished_ms is None:
                found.finished_ms = now

    # -- results --------------------------------------------------------------------------

    def result_of(self, job_id: str) -> StoredResult | None:
        """`select_result_sql`: the job's row unless expired, else its cancel's."""
        now = at(clock.now_ms())
        with self.lock:
            found = self.results.get(job_id)
            if found is not None:
                return found if found.expires_at > now else None
            cancel = self.cancels.get(job_id)
        if cancel is None:
            return None
        job_type, reason, when = cancel
        error = "cancelled" + (f": {reason}" if reason else "")
        return StoredResult(job_id, job_type, "cancelled", None, error, 0, at(when),
                            datetime.max.replace(tzinfo=UTC))


def _outbox_rows(args: tuple[Any, ...], rows: list[RawRecord]) -> None:
    topics, keys, values, headers = args[:4]
    rows.extend((topic, key, value, decode_headers(pairs))
                for topic, key, value, pairs in zip(topics, keys, values, headers, strict=True))


def _ms(seconds: Any) -> int:
    return round(float(seconds) * 1000)


__all__ = ["DoneRow", "MemoryTables", "RawRecord", "Workflow", "at"]
