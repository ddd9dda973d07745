"""The doors' bench table (:mod:`numba_pool_tools.bench.doors`): medians per allocator and the door's paired
difference to each other allocator of the same library, round by round."""

from __future__ import annotations

from numba_pool_tools.bench.doors import render


def test_the_table_gives_medians_and_paired_differences():
    figures = {256: {"numba_pool": [3.0, 5.0, 4.0], "MemoryPool": [2.0, 4.5, 1.0]}}
    table = render("cupy", figures).splitlines()
    assert table[0] == "### cupy"
    assert "| 256 B | numba_pool | 4.00 |  |" in table
    # paired round by round: 1.0, 0.5, 3.0 -> median 1.0 (the medians' difference would be 1.5)
    assert "| 256 B | MemoryPool | 2.00 | +1.00 |" in table
