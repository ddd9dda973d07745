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


def _child_reading(lines, monkeypatch, timeout: float = 5):
    # A _TorchChild over a stand-in process that never answers, its queue filled with ``lines``.
    import queue
    import subprocess
    import sys
    import tempfile

    from numba_pool_tools.bench import doors

    monkeypatch.setattr(doors, "ANSWER_TIMEOUT", timeout)
    child = doors._TorchChild.__new__(doors._TorchChild)
    child.which, child._said, child._lines = "stand-in", tempfile.TemporaryFile("w+"), queue.Queue()
    child.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE,
                                     text=True)
    for line in lines:
        child._lines.put(line)
    return child


def test_a_torch_childs_stray_lines_are_skipped_and_a_silent_child_fails_in_one_line(monkeypatch):
    import pytest

    child = _child_reading(["a library's print", "took 4.5"], monkeypatch)
    try:
        assert child._answer("took ") == "took 4.5"
    finally:
        child.process.kill()
        child.close()
    child = _child_reading([], monkeypatch, timeout=0.2)
    with pytest.raises(RuntimeError, match=r"^torch with stand-in: no figure \(no answer in 0.2 s\)$"):
        child._answer("took ")
