"""The allocation history's rows of the allocator part (tools/numba_pool_tools/bench/history_cost.py) without a
GPU: the switch on and off checked for what it leaves behind (and a planted residue caught), the
recorded paths on the CUDA model recording at the stack depth asked for, the rows, the checks (a
planted figure above 5 us at depth 20 flagged), the tables, and a whole allocator run on the
model."""

from __future__ import annotations

import functools
import sys
import threading
from types import SimpleNamespace

import pytest

import numba_pool
from cuda_model.harness import Program
from end_to_end_fakes import SETTING
from numba_pool_tools.bench import allocator_cost as a
from numba_pool_tools.bench import checks, core, history_cost, launch, noop
from numba_pool_tools.bench import report as bench_report
from numba_pool.observe import history
from numba_pool.plugin.manager import NumbaPoolManager
from numba_pool.plugin.state import process

ARENA, POOL = "numba_pool arena", "numba_pool"
DEPTH_20 = "numba_pool arena + history, depth 20"


@pytest.fixture(params=[True, False], ids=["arena", "mempool"])
def program(request):
    p = Program(arena=request.param)
    yield p
    numba_pool.record_history(False)
    p.close()


def in_a_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a new thread, whose stack is a few frames deep (pytest's is tens)."""
    out = {}

    def body():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - raised again in the test's thread
            out["error"] = err

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture
def small_rings(monkeypatch):
    """Recordings of 60 events (the default's 100 000 take seconds to fill on the model)."""
    monkeypatch.setattr(history_cost, "History", functools.partial(history.History, max_entries=60))


# -- switching on and off -----------------------------------------------------------------------

def test_switching_the_history_on_and_off_leaves_each_path_as_it_was(program):
    before = program.mm.path
    history_cost.switch_on_and_off({"x": program.mm})
    after = program.mm.path
    assert "history" not in after.layers and after.layers == before.layers
    assert after.allocate == before.allocate == program.mm.allocator.source.allocate  # nothing in between
    assert program.mm.memalloc == after.allocate and process.recording is None


def test_a_path_the_switch_leaves_recording_fails_the_worker(program, monkeypatch):
    recompose = NumbaPoolManager.recompose

    def only_on(self):  # planted: switching off forgets to compose the path again
        if process.recording is not None:
            recompose(self)

    monkeypatch.setattr(NumbaPoolManager, "recompose", only_on)
    with pytest.raises(history_cost.HistoryBenchError, match=r"^bench: x: after numba_pool.record_history\(\) on "
                                                             r"and off, its path is \('history', .*left something behind"):
        history_cost.switch_on_and_off({"x": program.mm})


def test_a_switch_that_reaches_no_path_fails_the_worker(program, monkeypatch):
    monkeypatch.setattr(NumbaPoolManager, "recompose", lambda self: None)
    with pytest.raises(history_cost.HistoryBenchError, match=r"put no history in the path of x \("):
        history_cost.switch_on_and_off({"x": program.mm})


# -- the recorded paths and their depth ---------------------------------------------------------

def test_at_depth_puts_the_block_at_the_depth_asked_or_as_shallow_as_it_can():
    def block():
        return history_cost.stack_depth(sys._getframe())

    here = history_cost.stack_depth(sys._getframe())
    assert history_cost.at_depth(here + 10, block) == here + 10
    assert history_cost.at_depth(here + 3, block) == here + 3
    assert history_cost.at_depth(here + 2, block) == here + 2  # this frame, at_depth's, then the block's
    assert history_cost.at_depth(1, block) == here + 2


def test_recorded_rows_record_into_their_own_history_through_the_managers_path(program):
    rows = history_cost.recorded({POOL if not program.mm.allocator.arena else ARENA: program.mm})
    path = rows[0].of
    assert [(r.label, r.stacks, r.depth) for r in rows] == [
        (f"{path} + history, no stacks", "none", None), (f"{path} + history, depth 5", "python", 5),
        (f"{path} + history, depth 20", "python", 20), (f"{path} + history, depth 50", "python", 50)]
    assert all(r.history.max_entries == history.DEFAULT_MAX_ENTRIES for r in rows)
    for row in rows:
        pointer = row.memalloc(1000)
        del pointer
        actions = [(e.action, e.size) for e in row.history.entries]
        assert actions == [("alloc", 1000), ("free", 1000)]  # requested and completed at once
        frames = row.history.entries[0].frames
        assert (frames[0].co_name if frames else None) == (None if row.stacks == "none" else
                                                              "test_recorded_rows_record_into_their_own_history_"
                                                              "through_the_managers_path")
    assert process.recording is None and "history" not in program.mm.path.layers  # the process records nothing


def test_a_recorded_path_that_is_not_the_managers_with_the_history_outermost_fails(program):
    program.mm.path = SimpleNamespace(layers=("counting", *program.mm.path.layers))  # planted: another path
    with pytest.raises(history_cost.HistoryBenchError, match=r"is \('history', '(arena|mempool)'\), not the manager's"):
        history_cost.recorded({ARENA: program.mm})


def test_each_row_is_filled_then_timed_at_its_depth_and_the_frames_are_read_back(program, small_rings):
    rows = history_cost.recorded({ARENA: program.mm})
    synchronized = []

    def measure():
        blocks = history_cost.ready(rows, a._block, 256, 7, lambda: synchronized.append(1))
        filled = {row.label: len(row.history.entries) for row in rows}
        memallocs = {row.label: row.memalloc for row in rows}
        a.time_in_turns({ARENA: program.mm.memalloc, **memallocs}, 256, repeats=2, pairs=3, blocks=blocks)
        return filled, history_cost.stack_depth(sys._getframe())

    filled, shallowest = in_a_thread(measure)
    assert set(filled.values()) == {60} and synchronized  # full rings before timing
    frames = {label: about["frames"] for label, about in history_cost.about(rows).items()}
    assert frames[f"{ARENA} + history, depth 20"] == 20 and frames[f"{ARENA} + history, depth 50"] == 50
    assert frames[f"{ARENA} + history, no stacks"] == 0
    # depth 5: the thread's frames below the bench's count too (threading's, measure, time_in_turns,
    # at_depth, the block): the fewest it can, one note
    assert frames[f"{ARENA} + history, depth 5"] == shallowest + 3 > 5
    assert history_cost.notes(rows) == [f"{ARENA} + history, depth 5: {shallowest + 3} frames recorded (the fewest "
                                        "this process can: the frames below the bench's own count too)"]


# -- rows, checks and tables --------------------------------------------------------------------

def times_of(added_at_20: float = 3.0, off_residue: float = 0.0) -> dict[str, list[float]]:
    """Per-repeat times of one size: the floors, the arena path off and never on, and it
    recording; repeat 3 in a slow spell (everything 1 us slower)."""
    spell = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    base = {"Numba alone": 0.5, "no-op floor": 1.0, f"{ARENA} (history never on)": 1.5, ARENA: 1.5 + off_residue,
            f"{ARENA} + history, no stacks": 3.5, f"{ARENA} + history, depth 5": 4.0,
            DEPTH_20: 1.5 + off_residue + added_at_20, f"{ARENA} + history, depth 50": 9.5 + off_residue}
    return {label: [us + s for s in spell] for label, us in base.items()}


def about_of() -> dict[str, dict]:
    return {f"{ARENA} + history, no stacks": {"of": ARENA, "stacks": "none", "depth": None, "frames": 0},
            f"{ARENA} + history, depth 5": {"of": ARENA, "stacks": "python", "depth": 5, "frames": 7},
            DEPTH_20: {"of": ARENA, "stacks": "python", "depth": 20, "frames": 20},
            f"{ARENA} + history, depth 50": {"of": ARENA, "stacks": "python", "depth": 50, "frames": 50}}


def table_of(added_at_20: float = 3.0, off_residue: float = 0.0) -> dict:
    return {"256": a.rows_of(times_of(added_at_20, off_residue), about_of())}


def test_rows_give_the_added_cost_against_the_path_off_and_the_off_path_against_never_on():
    rows = table_of(added_at_20=3.0, off_residue=0.01)["256"]
    depth_20 = rows[DEPTH_20]["history"]
    assert {k: v for k, v in depth_20.items() if k != "added"} == about_of()[DEPTH_20]
    assert depth_20["added"]["median"] == pytest.approx(3.0)  # paired: the slow spell cancels
    assert rows[f"{ARENA} + history, depth 50"]["history"]["added"]["median"] == pytest.approx(8.0)
    assert rows[ARENA]["vs_never_recorded"]["median"] == pytest.approx(0.01) and rows[ARENA]["history"] is None
    assert rows[f"{ARENA} (history never on)"]["vs_never_recorded"] is None
    assert checks.allocator_floor_flags({"256": rows}) == []


def test_clean_history_rows_raise_no_flag():
    assert checks.history_flags(table_of()) == []
    assert checks.history_flags(table_of(added_at_20=5.0, off_residue=-0.04)) == []  # 5 us itself passes


def test_a_planted_figure_above_5_us_at_depth_20_is_flagged_and_only_there():
    flags = checks.history_flags(table_of(added_at_20=5.3))
    assert [(f.table, f.figure, f.label) for f in flags] == [("history", "256", DEPTH_20)]
    assert str(flags[0]) == (f"CHECK FAILED [history] 256 B, {DEPTH_20}: +5.30 us per pair added at 20 frames "
                             "[95% CI +5.30, +5.30]: more than 5 us")
    # depth 50 adds 8 us here, unchecked: the target is depth 20's


@pytest.mark.parametrize("residue", [0.08, -0.08])
def test_a_planted_residue_of_the_switch_is_flagged(residue):
    flags = checks.history_flags(table_of(off_residue=residue))
    assert [(f.table, f.label) for f in flags] == [("history", ARENA)]
    assert f"{residue:+.2f} us per pair from the same path never switched on" in flags[0].message
    assert "more than 0.05 us" in flags[0].message


def test_a_depth_20_row_without_its_path_off_cannot_be_shown_within_the_target():
    times = times_of()
    del times[ARENA]
    flags = checks.history_flags({"256": a.rows_of(times, about_of())})
    assert [f.label for f in flags] == [DEPTH_20] and "cannot be checked" in flags[0].message


def test_the_main_table_leaves_the_history_rows_to_their_own():
    results = table_of(added_at_20=5.3)
    flags = checks.history_flags(results)
    main = a.render(results, flags)
    assert "history" not in main and f"| {ARENA} " in main
    text = history_cost.render(results, flags).splitlines()
    assert "frames recorded" in text[0] and "added, us [95% CI]" in text[0]
    labels = [line.split("|")[2].strip() for line in text[2:]]
    assert labels == [f"{ARENA} (history never on)", ARENA, f"{ARENA} + history, no stacks",
                      f"{ARENA} + history, depth 5", f"{DEPTH_20} !", f"{ARENA} + history, depth 50"]
    depth_20 = next(line for line in text if "depth 20" in line)
    assert "| Python stacks, depth 20 " in depth_20 and "| 20 " in depth_20 and "+5.30 [+5.30, +5.30]" in depth_20
    off = next(line for line in text if "off (switched on, then off)" in line)
    assert "+0.00 [+0.00, +0.00]" in off
    assert history_cost.present(results) and not history_cost.present({"256": {ARENA: {"median_us": 1.0}}})


def test_the_allocator_part_prints_the_history_table_and_its_failed_check(monkeypatch, capsys):
    output = {"sizes": table_of(added_at_20=6.0), "notes": [f"{ARENA} + history, depth 5: 7 frames recorded"],
              "core": 0, "frontend": core.FRONTEND.name}
    monkeypatch.setattr(launch, "run_module", lambda *command: output)
    report = {}
    flags = bench_report.allocator_part(report, SETTING, baseline=None, plain_pool=False, anchors=False, runs=1)
    out = capsys.readouterr().out
    assert [(f.table, f.label) for f in flags] == [("history", DEPTH_20)]
    assert "the allocation history's cost (numba_pool.record_history), run 1/1" in out
    assert f"| {DEPTH_20} ! " in out and f"CHECK FAILED [history] 256 B, {DEPTH_20}: +6.00 us" in out
    assert f"note: {ARENA} + history, depth 5: 7 frames recorded" in out
    assert report["allocator"]["256"][DEPTH_20]["history"]["frames"] == 20


# -- a whole allocator run on the CUDA model ------------------------------------------------------

@pytest.fixture
def model_run(monkeypatch, small_rings):
    """``allocator_cost.run`` on the CUDA model: the context and synchronize of the model's
    program, the no-op floors on a made-up buffer (the model has no ``cuMemAlloc``)."""
    p = Program(arena=False)
    # A worker has one frontend; this process may have both frontends' managers from other
    # tests, which makes NumbaPoolManager(context=<a stand-in>) ask which is meant.
    monkeypatch.setenv("NUMBA_POOL_FRONTEND", p.frontend.name)
    monkeypatch.setattr(a, "cuda", SimpleNamespace(current_context=lambda: p.context, synchronize=lambda: None))

    def grow(self, nbytes):
        self._buffer, self._buffer_bytes = 0x7000_0000, nbytes

    monkeypatch.setattr(noop.NoopManager, "_grow", grow)
    yield functools.partial(in_a_thread, a.run)
    numba_pool.record_history(False)
    p.close()


def test_a_run_takes_the_history_rows_in_the_same_turns(model_run):
    output = model_run(sizes=[256, 1 << 20], repeats=7)
    for size in ("256", str(1 << 20)):
        rows = output["sizes"][size]
        recorded = {label: r["history"] for label, r in rows.items() if r["history"]}
        assert len(recorded) == 8 and all(r["added"] is not None for r in recorded.values())
        assert {label: r["frames"] for label, r in recorded.items() if r["depth"] in (20, 50)} == {
            f"{path} + history, depth {d}": d for path in (POOL, ARENA) for d in (20, 50)}
        assert {label for label, r in rows.items() if r["vs_never_recorded"]} == {POOL, ARENA}
        assert {"Numba alone", "no-op floor", f"{POOL} (history never on)", f"{ARENA} (history never on)"} <= set(rows)
    assert [n.split(":")[0] for n in output["notes"]] == [f"{POOL} + history, depth 5", f"{ARENA} + history, depth 5"]
    assert process.recording is None


def test_a_run_without_the_history_has_none_of_its_rows(model_run):
    output = model_run(sizes=[256], repeats=6, history=False)
    assert set(output["sizes"]["256"]) == {POOL, ARENA, "no-op floor", "Numba alone"} and output["notes"] == []
