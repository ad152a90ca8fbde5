"""The outbox's rows and the rules around them. Pure: no database, no Kafka.

A row of `stream_jobs_outbox` is one whole record (topic, key, value, headers) written in
the caller's transaction; a relay produces it as it is and deletes it after the ack.
Here: the statements that write and claim rows (one text, spelt for each driver's
placeholders), the NOTIFY channel of a schema, which claimed rows a relay may send now
(the ordering rule), how long a row whose write failed waits, and the job IDs of child
jobs, derived from the parent's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from stream_jobs.errors import BadRecord
from stream_jobs.job_ids import job_id_time_ms
from stream_jobs.outcomes import Reason
from stream_jobs.postgres.names import OUTBOX_INSERT, named

TABLE = "stream_jobs_outbox"
# The one header of a row whose headers column cannot be read (`decode_headers`): the
# relay sends the row with it alone, so its lane's worker dead-letters it with the cause.
HEADER_UNREADABLE = "sj-outbox-error"
# Postgres keeps 63 bytes of an identifier; a LISTEN channel is one.
_CHANNEL_MAX = 63
# A failed write of a row waits this long, doubling per attempt up to the cap: short
# enough that rows go within seconds of a broker coming back.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
# A row Kafka cannot take (`park_oversized`) is looked at again this much later.
PARKED_RETRY_S = 60.0

Placeholders = Literal["asyncpg", "format", "named"]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One claimed row, shaped as the producer writes a record (`Outgoing`)."""

    id: int
    topic: str
    key: bytes | None
    payload: bytes
    header_pairs: tuple[tuple[str, bytes], ...] = field(default=())
    attempts: int = 0

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self.header_pairs)


def encode_headers(headers: Iterable[tuple[str, bytes]]) -> str:
    """Headers as the row's JSON: `[[name, value], ...]`, in order. Every header a job
    record carries is text; one that is not is refused here, before anything is written."""
    try:
        pairs = [[name, value.decode()] for name, value in headers]
    except UnicodeDecodeError as exc:
        raise ValueError(f"a record header is not UTF-8 text: {exc}") from exc
    return orjson.dumps(pairs).decode()


def decode_headers(stored: object) -> tuple[tuple[str, bytes], ...]:
    """The headers of a row as the driver returned them (JSON text, or parsed): a list of
    [name, value] pairs of text (a value may be an integer: its digits). Anything else,
    which only another program writing into the table can make, is `BadRecord`
    ("bad-header") with a sentence saying what the column holds."""
    try:
        pairs = orjson.loads(stored) if isinstance(stored, str | bytes) else stored
    except orjson.JSONDecodeError as exc:
        raise BadRecord(Reason.BAD_HEADER, f"The outbox row's headers are not JSON: {exc}.") \
            from None
    if not isinstance(pairs, list | tuple):
        raise BadRecord(Reason.BAD_HEADER, "The outbox row's headers are a JSON "
                        f"{type(pairs).__name__}, not a list of [name, value] pairs.")
    decoded = []
    for index, pair in enumerate(pairs):
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and (isinstance(pair[1], str) or type(pair[1]) is int)):
            raise BadRecord(Reason.BAD_HEADER, f"The outbox row's header number {index + 1} "
                            "is not a [name, value] pair of text.")
        try:
            decoded.append((pair[0], str(pair[1]).encode()))
            pair[0].encode()
        except UnicodeEncodeError:  # a lone surrogate, from a JSON escape
            raise BadRecord(Reason.BAD_HEADER, f"The outbox row's header number {index + 1} "
                            "is not valid UTF-8 text.") from None
    return tuple(decoded)


def channel(schema: str) -> str:
    """The NOTIFY channel of the outbox in `schema`: writers notify it in their
    transactions (delivered at commit), relays of that schema listen on it."""
    name = f"stream_jobs_outbox.{schema}"
    if len(name.encode()) <= _CHANNEL_MAX:
        return name
    return "stream_jobs_outbox." + hashlib.sha256(schema.encode()).hexdigest()[:32]


def table(schema: str) -> str:
    """The outbox table, qualified: a caller's connection may have any search_path."""
    return f'"{schema}".{TABLE}'


def spell(sql: str, style: Placeholders, names: Sequence[str]) -> str:
    """`sql` with `{0}`, `{1}`... as the driver's placeholders: asyncpg's `$1`, DB-API's
    `%s` (psycopg, Django) or SQLAlchemy's `:name`."""
    if style == "asyncpg":
        marks = [f"${i + 1}" for i in range(len(names))]
    elif style == "format":
        marks = ["%s"] * len(names)
    else:
        marks = [f":{name}" for name in names]
    return sql.format(*marks)


INSERT_NAMES = ("topics", "keys", "vals", "headers", "channel")


def insert_sql(schema: str, style: Placeholders) -> str:
    """One statement for any number of rows, then the NOTIFY that wakes the relays at
    commit: the row arrays in order (topics, keys, values, headers JSON) and the
    channel. Rows get their ids in the arrays' order."""
    sql = (
        "WITH written AS (INSERT INTO " + table(schema) + " (topic, key, value, headers) "
        "SELECT r.topic, r.key, r.value, r.headers::jsonb FROM unnest("
        "CAST({0} AS text[]), CAST({1} AS bytea[]), CAST({2} AS bytea[]), "
        "CAST({3} AS text[])) WITH ORDINALITY AS r(topic, key, value, headers, n) "
        "ORDER BY r.n RETURNING 1) "
        "SELECT pg_notify(CAST({4} AS text), '')"
    )
    return named(spell(sql, style, INSERT_NAMES), OUTBOX_INSERT)


def insert_args(records: Sequence[tuple[str, Any]], schema: str) -> tuple[Any, ...]:
    """The arguments of `insert_sql` for (topic, record) pairs (a record has `key`,
    `payload` and `headers()`)."""
    return ([topic for topic, _ in records], [rec.key for _, rec in records],
            [rec.payload for _, rec in records],
            [encode_headers(rec.headers()) for _, rec in records], channel(schema))


def named_args(args: Sequence[Any]) -> dict[str, Any]:
    """`insert_args` by name, for SQLAlchemy's `text()`."""
    return dict(zip(INSERT_NAMES, args, strict=True))


def claim_sql(schema: str) -> str:
    """Rows due for sending, oldest first, locked; rows another relay holds are skipped."""
    return (f"SELECT id, topic, key, value, headers, attempts FROM {table(schema)} "
            "WHERE retry_at IS NULL OR retry_at <= now() "
            "ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED")


def earlier_sql(schema: str) -> str:
    """Per topic and key, the smallest id below `$1` that is not among the claimed `$2`:
    rows another relay holds, rows waiting for a retry, rows committed since the claim."""
    return (f"SELECT topic, key, min(id) AS first_id FROM {table(schema)} "
            "WHERE id < $1 AND id NOT IN (SELECT unnest($2::bigint[])) "
            "GROUP BY topic, key")


def delete_sql(schema: str) -> str:
    return f"DELETE FROM {table(schema)} WHERE id = ANY($1::bigint[])"


def retry_sql(schema: str) -> str:
    """Rows whose write failed: count the attempt, keep the error, wait before the next
    (arrays of ids, seconds to wait and errors)."""
    return (f"UPDATE {table(schema)} AS o SET attempts = o.attempts + 1, last_error = r.error, "
            "retry_at = now() + make_interval(secs => r.wait_s) "
            "FROM unnest($1::bigint[], $2::float8[], $3::text[]) AS r(id, wait_s, error) "
            "WHERE o.id = r.id")


Slot = tuple[str, bytes | None]


def sendable(claimed: Sequence[OutboxRow], earlier: Mapping[Slot, int]
             ) -> tuple[list[OutboxRow], list[OutboxRow]]:
    """(send now, hold back) of the claimed rows, kept in id order.

    A row is held back while a row of the same topic and key with a smaller id is not
    among the claimed (`earlier` holds the smallest such id): sending it would put it in
    its partition ahead of that one. So rows of one key reach their partition in id
    order even when several relays share the work.
    """
    now: list[OutboxRow] = []
    held: list[OutboxRow] = []
    for row in claimed:
        first = earlier.get((row.topic, row.key))
        (held if first is not None and first < row.id else now).append(row)
    return now, held


def record_bytes(row: OutboxRow) -> int:
    """The row's size as a Kafka record, its framing counted generously."""
    return (len(row.payload) + len(row.key or b"") + 128
            + sum(len(name.encode()) + len(value) + 16 for name, value in row.header_pairs))


def park_oversized(rows: Sequence[OutboxRow], max_bytes: int
                   ) -> tuple[list[OutboxRow], dict[int, str]]:
    """(send now, why each of the others waits) of rows about to be sent.

    A row over `max_bytes` as a record (only another program writing into the table makes
    one: the client refuses such a payload) is one Kafka never takes; sent with the others,
    it would fail their topic's write every round. It waits, with its reason, for an
    operator to delete it; the rows of its topic and key after it wait with it, so their
    order holds.
    """
    now: list[OutboxRow] = []
    parked: dict[int, str] = {}
    blocked: dict[Slot, int] = {}
    for row in rows:
        slot = (row.topic, row.key)
        size = record_bytes(row)
        if slot in blocked:
            parked[row.id] = (f"It waits behind outbox row {blocked[slot]} of its topic and "
                              "key, which Kafka cannot take.")
        elif size > max_bytes:
            blocked[slot] = row.id
            parked[row.id] = (f"The row is {size:,} bytes as a record, over the {max_bytes:,} "
                              "the producer sends (STREAM_JOBS_MAX_PAYLOAD_BYTES and headers): "
                              "it is never sent; delete it, or raise the limit.")
        else:
            now.append(row)
    return now, parked


def retry_delay_s(attempts: int) -> float:
    """How long a row waits after its `attempts`-th failed write."""
    return min(RETRY_FIRST_S * 2.0 ** max(0, attempts - 1), RETRY_MAX_S)


def child_job_id(parent_id: str, name: str) -> str:
    """The job ID of the child `name` of job `parent_id`: the same every time the parent
    runs, so a parent that runs again makes the same children, which dedup by ID.

    For a UUIDv7 parent it is a UUIDv7 of the parent's millisecond (children sort with
    their parent); for any other parent ID, a UUIDv8. Either way 36 characters.
    """
    digest = int.from_bytes(hashlib.sha256(f"{parent_id}\x00{name}".encode()).digest()[:16],
                            "big")
    ms = job_id_time_ms(parent_id)
    if ms is not None:
        version, high = 0x7, ms & 0xFFFF_FFFF_FFFF
    else:
        version, high = 0x8, digest >> 80
    value = (high << 80 | version << 76 | (digest >> 64 & 0xFFF) << 64 | 0b10 << 62
             | digest & 0x3FFF_FFFF_FFFF_FFFF)
    text = value.to_bytes(16, "big").hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


__all__ = ["OutboxRow", "channel", "child_job_id", "insert_sql", "sendable"]
