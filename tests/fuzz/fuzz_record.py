"""A coverage-guided fuzz target for the record decoder and the header parser (atheris).

`tests/unit/test_fuzz_atheris.py` runs it with a fixed budget in the suite. For a longer
hunt, by hand (crashes are written as crash-* files under the prefix):

    .venv/bin/python tests/fuzz/fuzz_record.py -max_total_time=600 -artifact_prefix=/tmp/

An input is a record built from the fuzzer's bytes: key, header list, value and size
limit. Whatever it is, `decode_record` must return a job or raise `BadRecord` with a
known reason, and the dead letter of it must be well-formed; anything else is a crash.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["stream_jobs"]):
    import orjson

    from stream_jobs.errors import BadRecord
    from stream_jobs.failures import FailureInfo, parse_failure
    from stream_jobs.job_ids import MAX_JOB_ID_BYTES
    from stream_jobs.naming import LANES
    from stream_jobs.record import (
        HEADER_ERROR,
        HEADER_JOB_ID,
        HEADER_TYPE,
        dead_letter_headers,
        decode_record,
        parse_origin,
    )

REASONS = {"missing-value", "too-large", "missing-header", "bad-header", "wrong-type",
           "bad-json"}
NAMES = ["sj-job-id", "sj-type", "sj-attempt", "sj-enqueued-at", "sj-not-before",
         "sj-expires-at", "sj-lane", "sj-origin", "sj-error", "sj-requeues", "sj-rerun-of",
         "traceparent", "x-other"]
# Values that get an input past the early checks, so the fuzzer reaches the later ones.
VALUES = [b"email.send", b"job-1", b"1", b"0", b"high", b"low", b"default", b"{}",
          b"jobs.email.send/0/1", b"00-abc-def-01", b'{"reason":"x"}', b"9" * 20]
FAILURE = FailureInfo("bad-json", "E", "m", "", 0)


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    limit = fdp.ConsumeIntInRange(0, 512)
    key = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16)) if fdp.ConsumeBool() else None
    headers: list[tuple[str, bytes]] = []
    for _ in range(fdp.ConsumeIntInRange(0, 10)):
        name = (fdp.PickValueInList(NAMES) if fdp.ConsumeBool()
                else fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12)))
        raw = (fdp.PickValueInList(VALUES) if fdp.ConsumeBool()
               else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300)))
        headers.append((name, raw))
    value = None if fdp.ConsumeIntInRange(0, 15) == 0 else fdp.ConsumeBytes(
        fdp.remaining_bytes())

    try:
        record = decode_record(key=key, value=value, headers=headers,
                               expected_type="email.send", max_payload_bytes=limit)
    except BadRecord as bad:
        if bad.reason not in REASONS or not str(bad).endswith("."):
            raise AssertionError(f"unexpected BadRecord {bad.reason!r}: {bad}") from bad
    else:
        orjson.loads(record.payload)  # decoded means valid JSON
        if not 0 < len(record.job_id.encode()) <= MAX_JOB_ID_BYTES:
            raise AssertionError("a decoded job ID out of bounds")
        if record.attempt < 1 or record.lane not in LANES or len(record.payload) > limit:
            raise AssertionError(f"a decoded record breaks an invariant: {record!r}")

    letter = dict(dead_letter_headers(headers, failure=FAILURE, origin="t/0/1",
                                      job_type="email.send"))
    if HEADER_JOB_ID not in letter or HEADER_TYPE not in letter:
        raise AssertionError("a dead letter without a job ID or type")
    if parse_failure(letter[HEADER_ERROR]) != FAILURE:
        raise AssertionError("a dead letter whose failure does not parse back")
    for _, raw in headers:
        parse_failure(raw)
        parse_origin(raw.decode("utf-8", "replace"))


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
