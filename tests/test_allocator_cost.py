"""The in-process allocator bench's host side: the rotation of turns, paired differences and
their intervals, the baseline import and the table."""

from __future__ import annotations

import importlib
import os
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numba_pool import allocator_cost as a


def test_allocators_take_turns_in_rotated_order_after_one_warm_up_each():
    calls = []
    memallocs = {label: (lambda size, label=label: calls.append(label)) for label in "abc"}
    times = a.time_in_turns(memallocs, 256, repeats=3, pairs=1)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_every_block_is_followed_by_a_synchronize():
    events = []
    memallocs = {label: (lambda size, label=label: events.append(label)) for label in "ab"}
    a.time_in_turns(memallocs, 256, repeats=2, pairs=2, synchronize=lambda: events.append("sync"))
    assert events == ["a", "a", "b", "b", "sync", "a", "a", "sync", "b", "b", "sync",
                      "b", "b", "sync", "a", "a", "sync"]


@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=6, max_size=400))
def test_interval_brackets_the_median(samples):
    d = a.median_interval(samples)
    assert min(samples) <= d.low <= d.median <= d.high <= max(samples)
    assert d.median == statistics.median(samples)


def test_interval_of_201_samples_is_the_order_statistics_of_the_sign_test():
    d = a.median_interval([float(i) for i in range(201)])
    # k = floor((201 - 1.96 * sqrt(201)) / 2) = 86: the 86th and 116th smallest
    assert (d.low, d.median, d.high) == (85.0, 100.0, 115.0)


def test_too_few_samples_are_refused_with_the_count():
    with pytest.raises(ValueError, match="at least 6 samples, got 5"):
        a.median_interval([1.0] * 5)


def test_differences_are_paired_within_a_repeat():
    # A slow spell (repeat 3) hits both: the paired difference stays exactly 0.5.
    times = {"ref": [10.0, 10.0, 30.0, 10.0, 10.0, 10.0], "x": [10.5, 10.5, 30.5, 10.5, 10.5, 10.5]}
    d = a.paired_differences(times, "ref")["x"]
    assert (d.median, d.low, d.high) == (0.5, 0.5, 0.5)


def test_baseline_folder_without_a_package_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"--baseline {tmp_path}: no numba_pool/__init__.py"):
        a._import_baseline(str(tmp_path))


def test_table_shows_the_differences_with_intervals():
    d = {"median": 0.25, "low": 0.125, "high": 0.5}
    table = a.render({"256": {"numba_pool arena": {"median_us": 3.5, "above_reference": d, "vs_baseline": d},
                              "Numba alone": {"median_us": 1.0, "above_reference": None, "vs_baseline": None}}})
    lines = table.splitlines()
    assert "vs Numba alone" in lines[0] and "vs baseline" in lines[0]
    assert "| 256 B" in lines[2] and "3.50" in lines[2] and lines[2].count("+0.25 [+0.12, +0.50]") == 2


def test_baseline_is_imported_beside_ours_not_over_it():
    import numba_pool
    from numba_pool import manager

    baseline = a._import_baseline(os.path.dirname(os.path.dirname(numba_pool.__file__)))
    other = importlib.import_module("numba_pool_baseline.manager")
    assert baseline.__name__ == "numba_pool_baseline"
    assert other is not manager and other.NumbaPoolManager is not manager.NumbaPoolManager
    assert other.__name__ == "numba_pool_baseline.manager"
