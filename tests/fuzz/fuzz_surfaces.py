"""A coverage-guided fuzz target for the surfaces of issue 28 (atheris): the outbox row's
headers column, the batch and chain header, unique and debounce arguments, and cron.

`tests/unit/test_fuzz_atheris.py` runs it with a fixed budget in the suite; by hand:

    .venv/bin/python tests/fuzz/fuzz_surfaces.py -max_total_time=600 -artifact_prefix=/tmp/

Each input picks one surface and feeds it the fuzzer's bytes. It must accept them (and
the value then holds its invariants) or refuse them with our own error: anything else,
or an input that takes longer than libFuzzer's -timeout, is a crash.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["stream_jobs"]):
    from stream_jobs.errors import BadRecord, ConfigError
    from stream_jobs.job_ids import control_character
    from stream_jobs.outbox.rows import decode_headers, encode_headers
    from stream_jobs.periodic import ScheduleSpec
    from stream_jobs.schedules.timing import fire_times, next_fire_ms
    from stream_jobs.unique.rules import MAX_KEY_CHARS, key_claim
    from stream_jobs.workflows.members import parse_membership

NOW_MS = 1_780_000_000_000
WINDOWS = ["10m", "1d", "0", "nan", "1e400s", "99999999999999999999999d", "-5s", "30s"]
CRON_PARTS = ["*", "*/0", "*/15", "0-59/1", "1-31", "L", "LW", "1#5", "7#5", ",", "-", "/",
              "JAN", "MON-FRI", "0", "59", "60", "30", "2", " "]


def _headers(fdp: atheris.FuzzedDataProvider) -> None:
    raw = fdp.ConsumeBytes(fdp.remaining_bytes())
    try:
        headers = decode_headers(raw)
    except BadRecord as bad:
        if bad.reason != "bad-header" or not str(bad).endswith("."):
            raise AssertionError(f"unexpected BadRecord {bad.reason!r}: {bad}") from bad
        return
    if decode_headers(encode_headers(headers)) != headers:
        raise AssertionError("decoded headers do not round-trip")


def _membership(fdp: atheris.FuzzedDataProvider) -> None:
    member = parse_membership(fdp.ConsumeUnicode(fdp.remaining_bytes()))
    if member is not None and parse_membership(member.header()) != member:
        raise AssertionError(f"a membership that does not round-trip: {member!r}")


def _keys(fdp: atheris.FuzzedDataProvider) -> None:
    text = fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 300))
    window = fdp.PickValueInList(WINDOWS) if fdp.ConsumeBool() else fdp.ConsumeFloat()
    debounce = fdp.ConsumeBool()
    try:
        claim = key_claim(unique_key=None if debounce else text,
                          unique_for=None if debounce else window,
                          debounce=window if debounce else None, key=text)
    except ConfigError:
        return
    if claim is None or not 0 < len(claim.key) <= MAX_KEY_CHARS \
            or control_character(claim.key) is not None:
        raise AssertionError(f"a key taken that no row can hold: {claim!r}")
    claim.key.encode()


def _cron(fdp: atheris.FuzzedDataProvider) -> None:
    if fdp.ConsumeBool():
        cron = "".join(fdp.PickValueInList(CRON_PARTS)
                       for _ in range(fdp.ConsumeIntInRange(0, 40)))
    else:
        cron = fdp.ConsumeUnicode(fdp.remaining_bytes())
    try:
        spec = ScheduleSpec("fuzz", cron=cron)
    except ConfigError:
        return
    next_fire_ms(spec, NOW_MS)
    fire_times(spec, NOW_MS - 86_400_000 * 366, NOW_MS, newest=3)


SURFACES = [_headers, _membership, _keys, _cron]


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    fdp.PickValueInList(SURFACES)(fdp)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
