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


def test_libraries_interleave_round_by_round_each_with_its_order_rotated(monkeypatch):
    from numba_pool_tools.bench import doors

    monkeypatch.setattr(doors, "SIZES", [256, 512])
    calls = []

    def timer(name):
        def run(size, pairs):
            calls.append((name, size, pairs))
            return float(len(calls))
        return run
    synchronized = []
    libraries = {"x": ({"a": timer("a"), "b": timer("b")}, lambda: synchronized.append("x")),
                 "y": ({"c": timer("c")}, lambda: synchronized.append("y"))}
    out = doors._interleave(libraries, rounds=2, pairs=10)
    warm_up = [("a", 256, 2), ("b", 256, 2), ("c", 256, 2), ("a", 512, 2), ("b", 512, 2), ("c", 512, 2)]
    assert calls[:6] == warm_up
    # round 0: every size, every library, a before b; round 1: b before a
    assert calls[6:] == [("a", 256, 10), ("b", 256, 10), ("c", 256, 10), ("a", 512, 10), ("b", 512, 10),
                         ("c", 512, 10), ("b", 256, 10), ("a", 256, 10), ("c", 256, 10), ("b", 512, 10),
                         ("a", 512, 10), ("c", 512, 10)]
    assert out["x"][256] == {"a": [7.0, 14.0], "b": [8.0, 13.0]} and out["y"][512] == {"c": [12.0, 18.0]}
    assert len(synchronized) == 4 + 12  # after each library's warm-up, after each round of an allocator


def test_a_torch_child_that_cannot_start_says_which_allocator_in_one_line():
    import pytest

    from numba_pool_tools.bench import doors

    with pytest.raises(RuntimeError, match=r"^torch with no such: no figure \(\[\"no PyTorch allocator is called 'no such'\"\]\)$"):
        doors._TorchChild("no such")
