"""The scaling run's pure parts: the steady window, CPU in it, efficiency, the table, and
the merge that lets a partial bench run replace only its own sections of RESULTS.md."""

from __future__ import annotations

from typing import Any

import pytest

from ops.bench.common import BenchError, rotated
from ops.bench.report.merge import merge_sections, split_sections
from ops.bench.report.scaling import (
    SCALING_COLUMNS,
    ScalingPoint,
    efficiency,
    scaling_points,
    scaling_rows,
    scaling_section,
)
from ops.bench.scaling import (
    CpuSample,
    broker_setups,
    cores_in_window,
    parse_outcomes,
    steady_window,
)

# -- the steady window ----------------------------------------------------------------------


def test_one_process_window_is_first_to_last() -> None:
    steady = steady_window([[10.0, 10.5, 11.0, 12.0]])
    assert (steady.window_start, steady.window_end) == (10.0, 12.0)
    assert steady.jobs_in_window == 3  # the job that opens the window is not counted
    assert steady.rate == pytest.approx(1.5)
    assert steady.first_to_last_rate == pytest.approx(1.5)
    assert steady.jobs == 4


def test_window_runs_from_the_last_start_to_the_first_finish() -> None:
    early = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # starts first, finishes last
    late = [2.5, 3.5, 4.5]
    steady = steady_window([early, late])
    assert (steady.window_start, steady.window_end) == (2.5, 4.5)
    # In (2.5, 4.5]: 3.0 and 4.0 from the first process, 3.5 and 4.5 from the second.
    assert steady.jobs_in_window == 4
    assert steady.rate == pytest.approx(4 / 2.0)
    assert steady.window_s == pytest.approx(2.0)
    assert steady.first_to_last_rate == pytest.approx(8 / 5.0)


def test_jobs_before_the_release_are_left_out_but_counted() -> None:
    held = [[0.5, 10.0, 11.0, 12.0], [0.7, 10.2, 11.2, 12.2]]
    steady = steady_window(held, since=5.0)
    assert steady.window_start == 10.2
    assert steady.window_end == 12.0
    assert steady.jobs == 8
    assert steady.jobs_in_window == 3  # 11.0, 12.0 and 11.2, not 10.2 (it opens) or 12.2
    assert steady.rate == pytest.approx(3 / 1.8)
    assert steady.first_to_last_rate == pytest.approx(5 / 2.2)  # 10.0 to 12.2, held ones out


def test_a_process_that_ran_nothing_is_an_error() -> None:
    with pytest.raises(BenchError, match="process 2 of 2 ran no job"):
        steady_window([[1.0, 2.0], []])
    with pytest.raises(BenchError, match="ran no job"):
        steady_window([[1.0, 2.0], [0.5]], since=1.0)


def test_processes_that_never_overlapped_are_an_error() -> None:
    with pytest.raises(BenchError, match="never all worked at once"):
        steady_window([[1.0, 2.0], [3.0, 4.0]])


# -- CPU in the window ----------------------------------------------------------------------


def _sample(at: float, scale: float) -> CpuSample:
    return CpuSample(at=at, workers=scale, brokers=scale / 2, postgres=0.0, machine=2 * scale)


def test_cores_are_interpolated_to_the_window() -> None:
    # One core of workers throughout: cumulative CPU grows by one second per second.
    samples = [_sample(t, t) for t in (0.0, 1.0, 2.0, 3.0)]
    cores = cores_in_window(samples, 0.25, 2.75)
    assert cores == pytest.approx({"workers": 1.0, "brokers": 0.5, "postgres": 0.0,
                                   "machine": 2.0})


def test_cores_clamp_outside_the_samples() -> None:
    samples = [_sample(1.0, 0.0), _sample(2.0, 1.0)]
    # Before the first sample and after the last the series is flat.
    assert cores_in_window(samples, 0.0, 3.0)["workers"] == pytest.approx(1 / 3)


def test_cores_need_two_samples() -> None:
    with pytest.raises(BenchError):
        cores_in_window([_sample(0.0, 0.0)], 0.0, 1.0)


# -- small parsers --------------------------------------------------------------------------


def test_outcomes_from_the_worker_log() -> None:
    log = "worker for bench.scale-noop on ...\nstopped: duplicate 3, succeeded 997\n"
    assert parse_outcomes(log) == {"duplicate": 3, "succeeded": 997}
    assert parse_outcomes("stopped: no jobs\n") == {}
    assert parse_outcomes("crashed\n") == {}


def test_broker_setups() -> None:
    assert broker_setups("") == [1, 3]
    assert broker_setups("3") == [3]
    assert broker_setups("3,1,3") == [1, 3]
    with pytest.raises(BenchError, match="give 1, 3"):
        broker_setups("2")


def test_rotated_keeps_its_item_type() -> None:
    assert rotated([1, 2, 4], 1) == [2, 4, 1]
    assert rotated([1, 2, 4], 3) == [1, 2, 4]


# -- efficiency and the table ---------------------------------------------------------------


def test_efficiency() -> None:
    assert efficiency(1000.0, 1, 1000.0) == 1.0
    assert efficiency(3000.0, 4, 1000.0) == pytest.approx(0.75)
    assert efficiency(2500.0, 2, 1000.0) == pytest.approx(1.25)  # a shared box can do this
    with pytest.raises(ValueError, match="positive"):
        efficiency(1000.0, 2, 0.0)


def _run(processes: int, rate: float, repeat: int, *, brokers: int = 1,
         handler: str = "noop") -> dict[str, Any]:
    return {"brokers": brokers, "handler": handler, "processes": processes, "repeat": repeat,
            "rate": rate, "first_to_last_rate": rate * 0.9,
            "cores": {"workers": 0.5 * processes, "brokers": 0.25, "postgres": 0.25,
                      "machine": 2.0}}


def _points() -> list[ScalingPoint]:
    runs = [_run(1, 1000.0, 0), _run(1, 1200.0, 1), _run(2, 1800.0, 0), _run(2, 2000.0, 1),
            _run(4, 2400.0, 1), _run(4, 2200.0, 0)]
    return scaling_points(runs)


def test_points_are_medians_with_efficiency_paired_by_repeat() -> None:
    one, two, four = _points()
    assert (one.processes, two.processes, four.processes) == (1, 2, 4)
    assert one.efficiency == 1.0
    assert (one.efficiency_low, one.efficiency_high) == (1.0, 1.0)
    assert two.median == 1900.0
    assert two.efficiency == pytest.approx(1900 / (2 * 1100))
    # Repeat 0: 1800 / (2 x 1000); repeat 1: 2000 / (2 x 1200).
    assert two.efficiency_low == pytest.approx(2000 / 2400)
    assert two.efficiency_high == pytest.approx(1800 / 2000)
    assert four.rates == (2200.0, 2400.0)  # in repeat order
    assert four.efficiency == pytest.approx(2300 / 4400)
    # Workers 2.0 + broker 0.25 + Postgres 0.25 cores, over each repeat's rate.
    assert four.cpu_ms_per_job == pytest.approx((2500 / 2200 + 2500 / 2400) / 2)
    assert four.jobs_per_worker_core == pytest.approx(2300 / 2.0)


def test_a_point_without_a_one_process_run_is_left_out() -> None:
    assert scaling_points([_run(2, 1800.0, 0)]) == []


def test_per_core_efficiency_takes_out_the_cores_the_workers_got() -> None:
    one, _, four = _points()
    # Worker cores grow with the processes (0.5 each), jobs/s less than that.
    assert one.jobs_per_worker_core == pytest.approx(1100 / 0.5)
    assert four.core_efficiency == pytest.approx((2300 / 2.0) / (1100 / 0.5))
    assert one.core_efficiency == 1.0


def test_rows_render_the_table_cells() -> None:
    rows = scaling_rows(_points())
    assert len(rows[0]) == len(SCALING_COLUMNS)
    assert rows[0][:7] == ["1", "1", "no-op", "1,100", "1,000 - 1,200", "1.00", "1.00 - 1.00"]
    assert rows[2][5] == "0.52"  # 2300 / (4 x 1100)
    assert rows[2][7:11] == ["2.00", "1,150", "0.52", "0.25 / 0.25 / 2.00"]


def test_section_has_the_table_and_the_limit() -> None:
    runs = [_run(p, 1000.0 * p, r, brokers=b, handler=h)
            for b in (1, 3) for h in ("noop", "once") for p in (1, 2, 4) for r in (0, 1)]
    text = "\n".join(scaling_section({"runs": runs, "nproc": 2, "backlogs": {"noop": 10,
                                                                               "once": 5},
                                      "partitions": 12, "repeats": 2}, {}))
    assert text.startswith("## Scaling\n")
    assert text.count("| 4 | 3 | exactly-once |") == 1
    assert "### What limits it on this machine" in text
    assert "all 2 cores would cap it near" in text
    assert "the single broker used 0.25 of a core, the three-node cluster 0.25" in text
    # 2,000 jobs/s from 2 processes against 1,000 from one: efficiency 1.00, not above.
    assert "Efficiency above 1.00" not in text


def test_section_reports_a_failure() -> None:
    text = "\n".join(scaling_section({"runs": []}, {}, "BenchError: broker gone"))
    assert "**The scaling run failed**: BenchError: broker gone" in text
    assert "| processes |" not in text


# -- merging a partial run into RESULTS.md --------------------------------------------------

OLD = """# stream-jobs benchmarks

Generated on Monday.

## Goals

| goal | met |

## Memory detail

old memory

## Machine and versions

old machine
"""


def test_split_keeps_every_byte() -> None:
    parts = split_sections(OLD)
    assert [h for h, _ in parts] == ["", "Goals", "Memory detail", "Machine and versions"]
    assert "".join(block for _, block in parts) == OLD


def test_a_missing_section_goes_where_the_new_report_has_it() -> None:
    new = "# x\n\nGenerated on Tuesday.\n\n## Goals\n\nnothing\n\n## Scaling\n\nfresh\n\n" \
          "## Machine and versions\n\nnew machine\n"
    merged = merge_sections(OLD, new, ["Scaling"])
    assert merged == OLD.replace("## Machine and versions",
                                 "## Scaling\n\nfresh\n\n## Machine and versions")
    assert "Generated on Monday." in merged
    assert "nothing" not in merged


def test_a_present_section_is_replaced_in_place() -> None:
    old = OLD.replace("## Machine", "## Scaling\n\nstale\n\n## Machine")
    new = "## Scaling\n\nfresh\n\n"
    merged = merge_sections(old, new, ["Scaling"])
    assert merged == OLD.replace("## Machine", "## Scaling\n\nfresh\n\n## Machine")


def test_a_section_with_nothing_after_it_goes_last() -> None:
    merged = merge_sections("# t\n\n## A\n\na\n", "## Scaling\n\nfresh\n", ["Scaling"])
    assert merged == "# t\n\n## A\n\na\n\n## Scaling\n\nfresh\n"


def test_a_section_the_new_report_lacks_is_kept() -> None:
    old = OLD.replace("## Machine", "## Scaling\n\nkept\n\n## Machine")
    assert merge_sections(old, "# nothing here\n", ["Scaling"]) == old
