"""Batch and chain membership, fixed IDs, callback payloads and templates (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.errors import ConfigError
from stream_jobs.record import HEADER_ENQUEUED_AT, HEADER_EXPIRES_AT, JobRecord, decode_record
from stream_jobs.workflows.members import (
    Membership,
    callback_job_id,
    distinct_ids,
    parse_membership,
    step_job_id,
    template_of,
    with_summary,
    workflow_id_for,
)
from stream_jobs.workflows.progress import Progress

IDS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=64)


@given(IDS, st.integers(min_value=0, max_value=999_999_999))
def test_a_membership_reads_back_from_its_header(workflow_id: str, step: int) -> None:
    for member in (Membership("batch", workflow_id), Membership("chain", workflow_id, step)):
        assert parse_membership(member.header()) == member


@pytest.mark.parametrize("garbled", ["", "batch:", "chain:x:abc", "chain:1:", "chain:-1:a",
                                     "chain:1234567890:a", "tree:1:a", "batch"])
def test_a_garbled_header_is_no_membership(garbled: str) -> None:
    assert parse_membership(garbled) is None


def test_fixed_ids_are_the_same_every_time_and_differ_between_slots() -> None:
    chain = "01a2265a-9f17-7019-a966-4a00c51fb752"
    steps = [step_job_id(chain, i) for i in range(3)]
    assert steps == [step_job_id(chain, i) for i in range(3)]
    assert len(set(steps)) == 3
    assert callback_job_id(chain, "on_success") != callback_job_id(chain, "on_complete")
    assert workflow_id_for(chain, "0") != workflow_id_for(chain, "1")
    assert Membership("chain", chain, 2).previous_step_id == steps[1]
    assert Membership("chain", chain, 0).previous_step_id is None
    assert Membership("batch", chain).previous_step_id is None


def test_a_callback_payload_gets_an_empty_summary_and_may_not_set_its_own() -> None:
    value = orjson.loads(with_summary(b'{"album": 7, "batch": null}', "b1", 12, "album.ready"))
    assert value == {"album": 7, "batch": {"id": "b1", "total": 12, "succeeded": 0,
                                           "failed": 0}}
    with pytest.raises(ConfigError, match="sets 'batch'"):
        with_summary(b'{"batch": {"id": "mine"}}', "b1", 1, "album.ready")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        with_summary(b"[1, 2]", "b1", 1, "album.ready")


def test_a_template_keeps_the_record_but_its_times() -> None:
    record = JobRecord(job_id="j1", job_type="album.ready", payload=b'{"a": 1}', key=b"k",
                       enqueued_at_ms=1_000, expires_at_ms=61_000, workflow="chain:1:c")
    template = template_of("1", "jobs.album.ready", record)
    headers = dict(orjson.loads(template.headers_json))
    assert HEADER_ENQUEUED_AT not in headers
    assert HEADER_EXPIRES_AT not in headers
    assert headers["sj-workflow"] == "chain:1:c"
    assert template.expires_in_ms == 60_000
    assert (template.job_id, template.key, template.value) == ("j1", b"k", b'{"a": 1}')
    with pytest.raises(ConfigError, match="no delay or run_at"):
        template_of("1", "t", record.with_(not_before_ms=5_000))


def test_the_workflow_header_travels_with_the_record() -> None:
    record = JobRecord(job_id="j1", job_type="t", payload=b"{}", key=None,
                       workflow="batch:b-7")
    decoded = decode_record(key=None, value=record.payload, headers=record.headers(),
                            expected_type="t", max_payload_bytes=100)
    assert decoded.workflow == "batch:b-7"
    plain = JobRecord(job_id="j2", job_type="t", payload=b"{}", key=None)
    assert "sj-workflow" not in dict(plain.headers())


def test_two_members_with_one_id_are_refused() -> None:
    one = JobRecord(job_id="same", job_type="t", payload=b"{}", key=None)
    with pytest.raises(ConfigError, match="distinct IDs"):
        distinct_ids([one, one])


WHEN = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("kind", "total", "succeeded", "failed", "state", "pending"), [
    ("batch", 10, 3, 1, "running", 6),
    ("batch", 10, 10, 0, "succeeded", 0),
    ("batch", 10, 8, 2, "completed", 0),
    ("chain", 3, 1, 0, "running", 2),
    ("chain", 3, 3, 0, "succeeded", 0),
    ("chain", 3, 1, 1, "failed", 0),
])
def test_progress_says_where_a_workflow_stands(kind: str, total: int, succeeded: int,
                                               failed: int, state: str, pending: int) -> None:
    progress = Progress("w1", kind, total, succeeded, failed, WHEN, None,
                        failed_step=1 if kind == "chain" and failed else None,
                        failure="max-attempts: ValueError: no" if failed else None,
                        callbacks=(("on_success", "s1"), ("on_complete", "c1")))
    assert (progress.state, progress.pending) == (state, pending)
    assert progress.to_dict()["state"] == state
    if kind == "batch":
        assert progress.fired("on_complete") is (pending == 0)
        assert progress.fired("on_success") is (succeeded == total)
    summary = progress.summary()
    if state == "failed":
        assert f"stopped at step 1 of 3 ({step_job_id('w1', 1)})" in summary
        assert "ValueError: no" in summary
