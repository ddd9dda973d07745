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


def test_allocators_take_turns_round_by_round_with_the_order_rotated():
    from numba_pool_tools.bench import doors

    calls = []

    def timer(name):
        def run(size, pairs):
            calls.append((name, size, pairs))
            return float(len(calls))
        return run
    out = doors._rotate({"a": timer("a"), "b": timer("b")}, rounds=2, pairs=10)
    first = [c for c in calls if c[1] == doors.SIZES[0]]
    # the warm-up (pairs // 10 + 1 each), then round 0 a, b and round 1 b, a
    assert first == [("a", doors.SIZES[0], 2), ("b", doors.SIZES[0], 2), ("a", doors.SIZES[0], 10),
                     ("b", doors.SIZES[0], 10), ("b", doors.SIZES[0], 10), ("a", doors.SIZES[0], 10)]
    assert out[doors.SIZES[0]] == {"a": [3.0, 6.0], "b": [4.0, 5.0]}


def test_a_torch_child_that_cannot_start_says_which_allocator_in_one_line():
    import pytest

    from numba_pool_tools.bench import doors

    with pytest.raises(RuntimeError, match=r"^torch with no such: no figure \(\[\"no PyTorch allocator is called 'no such'\"\]\)$"):
        doors._TorchChild("no such")
