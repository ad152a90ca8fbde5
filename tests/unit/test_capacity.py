"""The capacity model's arithmetic, against the figures of issue 9 and by hand."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from stream_jobs.capacity import (
    Inputs,
    average_per_s,
    batch_size,
    blended_per_process,
    plan,
    processes_for,
    round_partitions,
)

REPO = Path(__file__).resolve().parents[2]


def near(value: float, expected: float, within: float = 0.01) -> bool:
    return abs(value - expected) <= abs(expected) * within


# -- the figures in the issue ---------------------------------------------------------------


def test_fifty_million_a_day() -> None:
    assert near(average_per_s(50e6), 580)
    # A peak three times the average is the 1,750/s.
    assert near(plan(Inputs(jobs_per_day=50e6, peak_factor=3)).peak_per_s, 1_750)


def test_one_point_four_billion_a_day_and_its_outage_backlog() -> None:
    p = plan(Inputs(jobs_per_day=1.4e9, peak_per_s=33_000, job_bytes=2_000, outage_s=600))
    assert near(p.average_per_s, 16_200)
    assert p.peak_per_s == 33_000
    assert p.backlog_jobs == 33_000 * 600
    assert near(p.backlog_bytes, 40e9, within=0.02)  # "~40 GB"
    assert near(p.peak_per_s / p.average_per_s, 2.04)


def test_one_point_four_billion_a_day_sized_by_hand() -> None:
    p = plan(Inputs(jobs_per_day=1.4e9, peak_per_s=33_000))
    # Catch-up: 33,000/s plus 19.8 M jobs over 30 minutes = 44,000/s; 1,500/s a process.
    assert p.catch_up_per_s == pytest.approx(44_000)
    assert (p.processes_once_peak, p.processes_noop_peak) == (22, 7)
    assert (p.processes_catch_up, p.processes) == (30, 31)
    assert p.partitions == 72  # 31 x 2 = 62, rounded up to a multiple of 12
    # 16,204/s x 2 KB x 7 days x 1.05 = 20.6 TB; + 72 GiB-segments; x3 replicas / 0.7.
    assert near(p.retained_bytes, 1.4e9 * 2_000 * 7 * 1.05)
    assert near(p.disk_bytes, (p.retained_bytes + 72 * (1 << 30)) * 3 / 0.7)
    assert (p.brokers_for_disk, p.brokers_for_writes, p.brokers) == (12, 3, 12)
    assert p.retention_covers_outage
    # Dedup: a row per job; 33,000/31 = 1,065 rows/s a process, 3.2 per 3 ms commit.
    assert p.dedup_rows_peak_per_s == 33_000
    assert p.dedup_batch == pytest.approx(33_000 / 31 * 0.003)
    assert p.dedup_commits_peak_per_s == pytest.approx(31 / 0.003)
    assert near(p.dedup_rows_kept, 1.4e9 * 7)
    assert near(p.dedup_table_bytes, 1.4e9 * 7 * 200)
    assert p.breaks_first.name == "postgres: commits"


def test_fifty_million_a_day_fits_the_smallest_cluster() -> None:
    p = plan(Inputs(jobs_per_day=50e6, peak_per_s=1_750))
    assert p.brokers == 3  # the replication factor, not disk or writes
    assert (p.processes_once_peak, p.processes) == (2, 3)
    assert p.partitions == 6
    assert all(limit.utilisation < 0.5 for limit in p.limits)


# -- the pieces -----------------------------------------------------------------------------


def test_processes_and_partitions_round_up() -> None:
    assert processes_for(1, 1_500) == 1
    assert processes_for(1_500, 1_500) == 1
    assert processes_for(1_501, 1_500) == 2
    assert [round_partitions(n) for n in (1, 6, 7, 12, 13, 62, 72)] == [6, 6, 12, 12, 24, 72, 72]


def test_blended_throughput_is_a_weighted_mean_of_time_per_job() -> None:
    base = {"jobs_per_day": 1, "noop_per_process": 5_000, "once_per_process": 1_000}
    assert blended_per_process(Inputs(**base, once_fraction=1)) == pytest.approx(1_000)
    assert blended_per_process(Inputs(**base, once_fraction=0)) == pytest.approx(5_000)
    # Half and half: (0.5/1000 + 0.5/5000) s per job.
    assert blended_per_process(Inputs(**base, once_fraction=0.5)) == pytest.approx(1 / 0.0006)


def test_group_commit_batches_stay_between_one_and_sixty() -> None:
    assert batch_size(100, 3, 60) == 1
    assert batch_size(2_000, 3, 60) == pytest.approx(6)
    assert batch_size(100_000, 3, 200) == 60  # the runtime caps batches at 60


def test_pruning_by_delete_doubles_the_rows_written() -> None:
    dropped = plan(Inputs(jobs_per_day=864e6, peak_per_s=10_000))
    deleted = plan(Inputs(jobs_per_day=864e6, peak_per_s=10_000, prune="delete"))
    assert dropped.dedup_deletes_per_s == 0
    assert deleted.dedup_deletes_per_s == pytest.approx(10_000)
    rows = {limit.name: limit.used for limit in deleted.limits}
    assert rows["postgres: dedup rows written"] == pytest.approx(20_000)


def test_a_short_retention_does_not_cover_an_outage() -> None:
    p = plan(Inputs(jobs_per_day=1e6, retention_s=1_800, outage_s=600, catch_up_s=1_800))
    assert not p.retention_covers_outage


def test_nonsense_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="jobs_per_day"):
        Inputs(jobs_per_day=0)
    with pytest.raises(ValueError, match="once_fraction"):
        Inputs(jobs_per_day=1, once_fraction=1.5)


# -- the script -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ops_capacity", REPO / "ops" / "capacity.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ops_capacity"] = module
    spec.loader.exec_module(module)
    return module


def test_the_script_reads_human_units(script: ModuleType,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(["--jobs-per-day", "1.4B", "--peak", "33k", "--job-size", "2KB",
                        "--outage", "10m", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backlog_bytes"] == pytest.approx(39.6e9)
    assert out["breaks_first"] == "postgres: commits"


def test_the_docs_show_the_scripts_output_for_both_loads(script: ModuleType,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    docs = (REPO / "docs" / "capacity.md").read_text()
    for argv in (["--jobs-per-day", "50M", "--peak", "1750"],
                 ["--jobs-per-day", "1.4B", "--peak", "33000", "--job-size", "2KB"]):
        assert script.main(argv) == 0
        assert capsys.readouterr().out.strip() in docs, f"re-paste the output of {argv}"
