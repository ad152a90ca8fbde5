"""The worker's collector settings: raised while workers run, restored after the last."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from stream_jobs.errors import ConfigError
from stream_jobs.runtime.gc_tuning import YOUNG_THRESHOLD, worker_collector
from stream_jobs.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def _thresholds_restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_raises_the_young_threshold_and_restores_all_three() -> None:
    gc.set_threshold(700, 11, 12)
    with worker_collector():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 11, 12)


def test_restores_only_when_the_last_of_nested_workers_stops() -> None:
    gc.set_threshold(700, 10, 10)
    with worker_collector():
        with worker_collector():
            assert gc.get_threshold()[0] == YOUNG_THRESHOLD
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    assert gc.get_threshold() == (700, 10, 10)


def test_keeps_a_higher_threshold_the_application_set() -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 4, 10, 10)
    with worker_collector():
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD * 4
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD * 4


def test_restores_when_the_worker_fails() -> None:
    gc.set_threshold(700, 10, 10)
    with pytest.raises(RuntimeError), worker_collector():
        raise RuntimeError("the loop failed")
    assert gc.get_threshold() == (700, 10, 10)


def test_a_threshold_of_zero_leaves_the_collector_alone() -> None:
    gc.set_threshold(700, 10, 10)
    with worker_collector(0):
        assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_the_setting_reads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_JOBS_WORKER_GC_YOUNG_THRESHOLD", "700")
    assert Settings().worker_gc_young_threshold == 700
    monkeypatch.setenv("STREAM_JOBS_WORKER_GC_YOUNG_THRESHOLD", "-1")
    with pytest.raises(ConfigError, match="WORKER_GC_YOUNG_THRESHOLD"):
        load_settings()
