"""The in-process allocator bench without a GPU: the rotation of turns, paired differences and
their intervals, the baseline import and the table."""

from __future__ import annotations

import importlib
import os
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numba_pool_tools.bench import allocator_cost as a


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
        a.import_baseline(str(tmp_path))


def test_table_shows_the_differences_with_intervals():
    d = {"median": 0.25, "low": 0.125, "high": 0.5}
    table = a.render({"256": {"numba_pool arena": {"median_us": 3.5, "above_reference": d, "vs_baseline": d},
                              "Numba alone": {"median_us": 1.0, "above_reference": None, "vs_baseline": None}}})
    lines = table.splitlines()
    assert "vs Numba alone" in lines[0] and "vs baseline" in lines[0]
    assert "| 256 B" in lines[2] and "3.50" in lines[2] and lines[2].count("+0.25 [+0.12, +0.50]") == 2


def test_managed_pairs_are_timed_in_turns_against_numba_and_the_baseline(monkeypatch):
    # Each allocator's pair costs what its fake says (µs, through a fake clock): the paired
    # differences must come out exactly, per label, against Numba's manager and the baseline.
    cost = {a.NUMBA_POOL: 20, a.ARENA: 19, a.NUMBA_POOL + a.BASELINE_SUFFIX: 21,
            a.ARENA + a.BASELINE_SUFFIX: 18, a.NUMBA_MANAGED: 40}
    now = [0.0]
    made = {label: (lambda size, label=label: now.__setitem__(0, now[0] + cost[label] * 1e-6)) for label in cost}
    monkeypatch.setattr(a, "managed_allocators", lambda context, baseline: dict(made))
    monkeypatch.setattr(a.time, "perf_counter", lambda: now[0])

    class Cuda:
        current_context = staticmethod(lambda: None)
        synchronize = staticmethod(lambda: None)

    monkeypatch.setattr(a, "cuda", Cuda)
    monkeypatch.setattr(a, "quiet_host", __import__("contextlib").nullcontext)
    rows = a.run_managed("folder", repeats=7)
    assert rows[a.NUMBA_POOL]["median_us"] == pytest.approx(20)
    assert rows[a.NUMBA_POOL]["vs_baseline"]["median"] == pytest.approx(-1)
    assert rows[a.ARENA]["vs_baseline"]["median"] == pytest.approx(1)
    assert rows[a.ARENA]["vs_numba"]["median"] == pytest.approx(-21)
    assert rows[a.NUMBA_MANAGED]["vs_numba"] is None and rows[a.NUMBA_MANAGED]["vs_baseline"] is None
    table = a.render_managed(rows).splitlines()
    assert "| 4 KiB" in table[2] and "-1.00 [-1.00, -1.00]" in table[2]


def test_every_managed_allocator_is_called_as_numba_calls_it(monkeypatch):
    # Numba's own memallocmanaged(size, attach_global) has no default for attach_global.
    calls = []

    class Manager:
        def __init__(self, label):
            self.label = label

        def memallocmanaged(self, size, attach_global):
            calls.append((self.label, size, attach_global))

    class Context:
        memory_manager = Manager("numba")

    monkeypatch.setattr(a, "pool_manager", lambda package, context, arena: Manager(("arena" if arena else "pool")))
    chosen = a.managed_allocators(Context())
    for memalloc in chosen.values():
        memalloc(4096)
    assert sorted(calls) == [("arena", 4096, True), ("numba", 4096, True), ("pool", 4096, True)]


def test_baseline_is_imported_beside_ours_not_over_it():
    import numba_pool

    baseline = a.import_baseline(os.path.dirname(os.path.dirname(numba_pool.__file__)))
    ours, other = a.manager_module(numba_pool), a.manager_module(baseline)
    assert baseline.__name__ == "numba_pool_baseline"
    assert other is not ours and other.NumbaPoolManager is not ours.NumbaPoolManager
    assert other.__name__ == "numba_pool_baseline" + ours.__name__.removeprefix("numba_pool")


#: A numba_pool whose manager takes its configuration as an argument (numba_pool.plugin.manager).
PLUGIN_LAYOUT = {
    "config.py": "def load(environ=None, **options):\n    return {'environ': environ, **options}\n",
    "plugin/__init__.py": "",
    "plugin/manager.py": (
        "class NumbaPoolManager:\n"
        "    def __init__(self, context, config):\n"
        "        self.context, self.config, self.initialized = context, config, False\n"
        "    def initialize(self):\n"
        "        self.initialized = True\n"),
}
#: A numba_pool from before numba_pool.plugin: the configuration is process-wide (_set_config).
MANAGER_LAYOUT = {
    "config.py": PLUGIN_LAYOUT["config.py"],
    "manager.py": (
        "_installed = None\n"
        "def _set_config(config):\n"
        "    global _installed\n"
        "    _installed = config\n"
        "class NumbaPoolManager:\n"
        "    def __init__(self, context):\n"
        "        self.context, self.config, self.initialized = context, None, False\n"
        "    def initialize(self):\n"
        "        self.config, self.initialized = _installed, True\n"),
}


def fake_numba_pool(folder, name: str, files: dict):
    """A package ``name`` in ``folder`` made of ``files`` ({path: text}), imported."""
    for path, text in files.items():
        (folder / name / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / name / path).write_text(text)
    (folder / name / "__init__.py").write_text("")
    return importlib.import_module(name)


@pytest.mark.parametrize("name, layout, manager_module", [
    ("plugin", PLUGIN_LAYOUT, "plugin.manager"),
    ("before_plugin", MANAGER_LAYOUT, "manager"),
    ("plugin_beside_an_old_manager", {**PLUGIN_LAYOUT, "manager.py": "NumbaPoolManager = None\n"}, "plugin.manager"),
])
def test_a_pool_manager_gets_its_configuration_in_either_layout(tmp_path, monkeypatch, name, layout, manager_module):
    monkeypatch.syspath_prepend(str(tmp_path))
    package = fake_numba_pool(tmp_path, f"fake_numba_pool_{name}", layout)
    manager = a.pool_manager(package, "the context", arena=True, ipc=False)
    assert type(manager).__module__ == f"{package.__name__}.{manager_module}"
    assert manager.context == "the context" and manager.initialized
    assert manager.config == {"environ": {}, "arena": True, "ipc": False}  # the defaults, not this environment


# -- ratios to the floor's overhead, and the checks of the allocator tables -------------------------

from numba_pool_tools.bench import anchors, checks  # noqa: E402


def test_ratio_is_the_overhead_over_the_floors_per_repeat():
    # Repeat 3 runs twice as slow (the host's speed changed): the µs double, the ratio holds.
    alone = [1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    times = {"Numba alone": alone, "no-op floor": [t * 1.5 for t in alone],  # overhead 0.5 t
             "arena": [t * 1.35 for t in alone], "numba_pool": [t * 2.0 for t in alone]}
    ratios = a.paired_ratios(times)
    assert set(ratios) == {"arena", "numba_pool"}  # none for the reference or the floor itself
    assert ratios["arena"].median == pytest.approx(0.70) and ratios["arena"].high == pytest.approx(0.70)
    assert ratios["numba_pool"].median == pytest.approx(2.0)


def test_ratio_leaves_out_repeats_where_the_floor_costs_nothing():
    times = {"Numba alone": [1.0] * 8, "no-op floor": [1.0] + [1.5] * 7, "x": [9.0] + [2.0] * 7}
    assert a.paired_ratios(times)["x"].median == pytest.approx(2.0)


def test_prepare_runs_untimed_before_every_block_of_its_allocator():
    events = []
    memallocs = {label: (lambda size, label=label: events.append(label)) for label in "ab"}
    a.time_in_turns(memallocs, 256, repeats=2, pairs=1, prepare={"b": lambda: events.append("use b")})
    assert events == ["a", "use b", "b", "a", "use b", "b", "use b", "b", "a"]


def difference(median):
    return {"median": median, "low": median - 0.1, "high": median + 0.1}


def row(us, above_reference=None, above_floor=None, ratio=None):
    return {"median_us": us, "above_reference": None if above_reference is None else difference(above_reference),
            "above_floor": None if above_floor is None else difference(above_floor),
            "ratio_to_floor": None if ratio is None else difference(ratio), "vs_baseline": None, "vs_plain": None}


def table(arena_ratio=0.70, pool_ratio=1.90, floor_above=0.50, arena_above=0.35, cupy_above_floor=1.0):
    return {"256": {"numba_pool": row(2.0, 0.95, 0.45, pool_ratio),
                    "numba_pool arena": row(1.4, arena_above, arena_above - floor_above, arena_ratio),
                    "cupy (pool)": row(2.6, 1.5, cupy_above_floor, 3.0),
                    "no-op floor": row(1.5, floor_above, None, None),
                    "Numba alone": row(1.0, None, -floor_above, None)}}


def test_a_clean_allocator_table_raises_no_flag():
    assert checks.allocator_floor_flags(table()) == []


def test_planted_floor_inversions_are_each_flagged():
    # The no-op floor below Numba alone, numba_pool's arena below Numba alone, CuPy's plugin
    # (a finalizer, like the no-op floor) below the no-op floor.
    flags = checks.allocator_floor_flags(table(floor_above=-0.2, arena_above=-0.05, cupy_above_floor=-0.3))
    assert {(f.label, f.table) for f in flags} == {("no-op floor", "allocator"), ("numba_pool arena", "allocator"),
                                                   ("cupy (pool)", "allocator")}
    arena = next(f for f in flags if f.label == "numba_pool arena")
    assert str(arena).startswith("CHECK FAILED [allocator] 256 B, numba_pool arena: -0.05 us below Numba alone")


def test_planted_disagreement_between_runs_is_flagged_and_agreement_is_not():
    # mempool path 1.86 vs 2.03 (9 %: agrees), the arena 0.70 vs 0.78 (11 %: flagged).
    flags = checks.runs_flags([table(0.70, 1.86), table(0.78, 2.03)])
    assert [(f.table, f.label) for f in flags] == [("allocator runs", "numba_pool arena")]
    assert "disagree by 11 %" in flags[0].message and "0.7, 0.78" in flags[0].message
    assert checks.runs_flags([table(0.70, 1.86), table(0.70, 1.86), table(0.75, 2.0)]) == []
    assert checks.runs_flags([table()]) == []  # one run: nothing to compare


def test_a_ratio_that_is_not_positive_cannot_agree():
    flags = checks.runs_flags([table(arena_ratio=-0.1), table(arena_ratio=0.1)])
    assert [f.label for f in flags] == ["numba_pool arena"] and "not all positive" in flags[0].message


def test_table_shows_the_ratio_and_marks_a_flagged_row():
    results = table(arena_above=-0.05)
    flags = checks.allocator_floor_flags(results)
    lines = a.render(results, flags).splitlines()
    assert "overhead / no-op floor's [95% CI]" in lines[0]
    arena = next(line for line in lines if "numba_pool arena" in line)
    assert "numba_pool arena !" in arena and "0.70 [0.60, 0.80]" in arena
    assert "numba_pool !" not in a.render(results, flags)


def test_runs_side_by_side_with_their_spread():
    runs = [table(0.70, 1.86), table(0.78, 2.03)]
    text = a.render_runs(runs, checks.runs_flags(runs))
    arena = next(line for line in text.splitlines() if "arena" in line)
    assert "numba_pool arena !" in arena and "0.70" in arena and "0.78" in arena and "1.114" in arena
    assert "run 2" in text.splitlines()[0]


# -- anchors ----------------------------------------------------------------------------------------

def test_anchors_not_installed_are_one_note_each(monkeypatch):
    monkeypatch.setattr(anchors, "installed", lambda label: False)
    memallocs, prepare, notes = anchors.in_process(context=None, frontend="numba-cuda")
    assert memallocs == {} and prepare == {}
    assert notes == ["rmm (pool): row skipped, rmm is not installed (pip install rmm-cu13)",
                     "rmm (cuda_async): row skipped, rmm is not installed (pip install rmm-cu13)",
                     "cupy (pool): row skipped, cupy is not installed (pip install cupy-cuda13x)"]


def test_an_anchor_that_fails_to_start_is_one_line_not_a_traceback(monkeypatch):
    def broken(context):
        raise RuntimeError("Traceback (most recent call last):\n  File x\nImportError: libcudart.so.13: cannot open")

    monkeypatch.setattr(anchors, "installed", lambda label: True)
    monkeypatch.setattr(anchors, "rmm_in_process", broken)
    monkeypatch.setattr(anchors, "cupy_in_process", lambda context: {"cupy (pool)": (len, None)})
    memallocs, prepare, notes = anchors.in_process(context=None, frontend="numba-cuda")
    assert memallocs == {"cupy (pool)": len} and prepare == {}
    assert notes == ["rmm (pool): row skipped, it failed: ImportError: libcudart.so.13: cannot open",
                     "rmm (cuda_async): row skipped, it failed: ImportError: libcudart.so.13: cannot open"]


def test_rows_keep_the_old_fields_and_add_the_floor_and_the_ratio():
    alone = [1.0 + 0.01 * i for i in range(9)]
    times = {"numba_pool": [t + 1.0 for t in alone], "no-op floor": [t + 0.5 for t in alone], "Numba alone": alone}
    rows = a.rows_of(times)
    assert set(rows["numba_pool"]) == {"median_us", "above_reference", "vs_baseline", "vs_plain", "above_floor",
                                       "ratio_to_floor", "vs_never_recorded", "history"}
    assert rows["numba_pool"]["vs_never_recorded"] is None and rows["numba_pool"]["history"] is None
    assert rows["numba_pool"]["above_reference"]["median"] == pytest.approx(1.0)
    assert rows["numba_pool"]["above_floor"]["median"] == pytest.approx(0.5)
    assert rows["numba_pool"]["ratio_to_floor"]["median"] == pytest.approx(2.0)
    assert rows["no-op floor"]["ratio_to_floor"] is None and rows["Numba alone"]["above_reference"] is None
    assert checks.allocator_floor_flags({"256": rows}) == []
