"""The end-to-end bench without a GPU: the worker's timing helpers, the parent's tables, checks and
runs (its workers faked), and the choice of no-op floor."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from end_to_end_fakes import SETTING, clean_results, result
from helpers import FRONTENDS, MISSING_FRONTENDS, PACKAGE_PARENT
from numba_pool_tools.bench import anchors, checks, core, device_tables, end_to_end, launch, noop, timing, worker
from numba_pool_tools.bench import report as bench_report
from numba_pool_tools.bench.report import Setting
from numba_pool.config import ConfigError

SAID = {"frontend": core.FRONTEND.name}  # what a bench process says it ran under: this process's frontend


def test_sizes_take_turns_inside_each_repeat():
    order = []
    bodies = {key: (lambda key=key: order.append(key)) for key in ("a", "b", "c")}
    medians = timing.median_times_taking_turns(bodies, repeats=3)
    assert order == ["a", "b", "c"] * 3
    assert set(medians) == {"a", "b", "c"} and all(t >= 0 for t in medians.values())


def test_table_gives_signed_differences_from_both_floors():
    table = device_tables.render({
        end_to_end.DEFAULT.label: result(12.0, 25.0, 25.0, 85.0, 127.0),
        end_to_end.ARENA.label: result(4.0, 9.25, 9.5, 11.0, 11.0),
        end_to_end.FLOOR.label: result(4.0, 9.75, 9.75, 9.75, 9.75),
        end_to_end.BARE_FLOOR.label: result(4.0, 8.25, 8.25, 8.25, 8.25),
    })
    header, _, default, arena, floor, bare = table.splitlines()
    assert "(no-op floor, Numba alone)" in header
    assert "1.00" in default and "25.00 (+15.25, +16.75)" in default
    assert "3.00" in arena
    assert "9.25 (-0.50, +1.00)" in arena and "11.00 (+1.25, +2.75)" in arena
    assert "9.75 (+0.00, +1.50)" in floor and "8.25 (-1.50, +0.00)" in bare


def test_table_without_floors_has_plain_times():
    table = device_tables.render({end_to_end.DEFAULT.label: result(12.0, 25.0, 25.0, 85.0, 127.0)})
    assert "(" not in table.splitlines()[2] and "25.00" in table


@pytest.mark.parametrize("value, chosen", [("", noop.NoopManager), ("1", noop.NoopManager),
                                           ("0", noop.BareNoopManager), ("off", noop.BareNoopManager)])
def test_floor_is_chosen_by_its_variable(value, chosen):
    assert noop.chosen_manager({"NUMBA_POOL_NOOP_FINALIZER": value}) is chosen


def test_bad_floor_variable_is_named():
    with pytest.raises(ConfigError, match="NUMBA_POOL_NOOP_FINALIZER='maybe'"):
        noop.chosen_manager({"NUMBA_POOL_NOOP_FINALIZER": "maybe"})


# -- checks of the end-to-end table, pinning, the collector, ratios to default ---------------------

import gc  # noqa: E402


def test_floors_of_each_row():
    assert checks.floors_of("Numba alone") == []
    assert checks.floors_of("no-op floor") == ["Numba alone"]
    assert checks.floors_of("numba_pool arena (baseline)") == ["Numba alone"]
    for label in ("default", "rmm (pool)", "rmm (cuda_async)", "cupy (pool)"):  # finalizers: weakref.finalize
        assert checks.floors_of(label) == ["Numba alone", "no-op floor"]


def test_a_clean_end_to_end_table_raises_no_flag():
    assert checks.end_to_end_floor_flags(clean_results()) == []


def test_planted_end_to_end_inversions_are_flagged_at_their_size():
    results = clean_results()
    results[end_to_end.FLOOR.label]["alloc_free_us"]["256"] = 8.0  # the no-op floor below Numba alone
    results[end_to_end.NUMBA_POOL.label]["alloc_free_us"]["65536"] = 8.0  # numba_pool below Numba alone
    results[end_to_end.CUPY.label]["alloc_free_us"]["4194304"] = 9.5  # a finalizer plugin below the no-op floor
    flags = checks.end_to_end_floor_flags(results)
    assert {(f.figure, f.label) for f in flags} == {("256", "no-op floor"), ("65536", "numba_pool"),
                                                    ("4194304", "cupy (pool)")}
    assert str(flags[0]) == ("CHECK FAILED [end to end] 64 KiB, numba_pool: 8.00 us is 0.25 us below Numba alone "
                             "(8.25 us): a floor inversion")


def rounds_of(*seed_ms_and_us):
    return [result(seed, *([us] * len(worker.SIZES))) for seed, us in seed_ms_and_us]


def test_rounds_within_ten_percent_agree_and_a_planted_outlier_is_flagged():
    assert checks.rounds_flags({"numba_pool": rounds_of((4.0, 10.0), (4.1, 10.9), (4.0, 10.5))}) == []
    flags = checks.rounds_flags({"numba_pool": rounds_of((4.0, 10.0), (4.0, 11.2), (4.0, 10.1)),
                                       "default": rounds_of((12.0, 25.0), (14.0, 25.0))})
    assert [(f.label, f.figure) for f in flags] == [("numba_pool", str(s)) for s in worker.SIZES] + [
        ("default", "benchmark loop")]
    assert "disagree by 12 % (max/min 1.120 > 1.10): 10, 11.2, 10.1" in flags[0].message


def test_table_marks_flagged_cells_and_ratios_to_default():
    results = clean_results()
    results[end_to_end.NUMBA_POOL.label]["alloc_free_us"]["65536"] = 8.0
    flags = checks.end_to_end_floor_flags(results)
    pool = next(line for line in device_tables.render(results, flags).splitlines() if line.startswith("| numba_pool "))
    cells = [cell.strip() for cell in pool.strip("|").split("|")]
    assert cells[3:] == ["10.00 (+0.25, +1.75)", "8.00 (-1.75, -0.25) !", "10.00 (+0.25, +1.75)",
                         "10.00 (+0.25, +1.75)"]
    ratios = device_tables.ratios_to_default(results)
    assert ratios["numba_pool"]["benchmark loop"] == 3.0 and ratios["numba_pool"]["256"] == 2.5
    assert ratios["numba_pool"]["65536"] == 25.0 / 8.0 and ratios["default"]["256"] == 1.0
    table = device_tables.render_ratios(results, flags)
    assert "x faster than default" in table.splitlines()[0]
    assert "| 3.00 " in table and "3.12 !" in table


def test_rounds_are_kept_beside_their_median():
    merged = device_tables.median_over_rounds([{**result(4.0, 1, 2, 3, 4), "manager": "m", "core": 0},
                                       {**result(5.0, 2, 2, 3, 4), "manager": "m", "core": 0},
                                       {**result(6.0, 9, 2, 3, 4), "manager": "m", "core": 0}])
    assert merged["alloc_free_us"]["256"] == 2 and merged["rounds_alloc_free_us"]["256"] == [1, 2, 9]
    assert merged["rounds_seed_loop_ms"] == [4.0, 5.0, 6.0] and merged["core"] == 0 and merged["rounds"] == 3


def test_core_is_the_lowest_allowed_or_the_one_asked_for():
    assert timing.chosen_core(None, {3, 1, 7}) == 1
    assert timing.chosen_core(7, {3, 1, 7}) == 7
    with pytest.raises(ValueError, match=r"--core 2: not a CPU core this process may run on \(allowed: 1, 3, 7\)"):
        timing.chosen_core(2, {3, 1, 7})


def test_while_timing_one_core_and_no_collector_then_both_restored():
    before = os.sched_getaffinity(0)
    core = max(before)
    assert gc.isenabled()
    with timing.quiet_host({timing.CORE_VARIABLE: str(core)}) as pinned:
        assert pinned == core and os.sched_getaffinity(0) == {core} and not gc.isenabled()
    assert os.sched_getaffinity(0) == before and gc.isenabled()
    with timing.quiet_host({}) as pinned:
        assert pinned == min(before)


def test_every_worker_gets_the_same_core(monkeypatch):
    seen = []
    monkeypatch.setattr(launch, "run_module", lambda module, args, env, cwd: seen.append(env) or SAID)
    for manager in (end_to_end.DEFAULT, end_to_end.ARENA):
        end_to_end.measure(manager, core=5)
    assert [env[timing.CORE_VARIABLE] for env in seen] == ["5", "5"]
    assert seen[1]["NUMBA_POOL_ARENA"] == "1"


def test_summary_never_reads_clean_when_a_check_failed():
    flag = checks.Flag("end to end", "256", "numba_pool", "x")
    assert checks.summary([flag]).startswith("SELF-CHECKS: 1 FAILED")
    assert checks.summary([]).startswith("self-checks passed")


# -- the bench command's helpers, with the workers faked ------------------------------------------

def fake_worker(slow_round=None, failing=()):
    """An end_to_end.measure stand-in: clean figures, numba_pool 20 % slower in round ``slow_round``."""
    calls = {}

    def measure(manager, core=None, warm_up=False):
        if manager.label in failing:
            raise RuntimeError(f"benchmark of {manager.label} failed: exit 1:\nTraceback (most recent call last):\n"
                               "  File \"x\", line 1\nImportError: librmm.so: cannot open shared object file")
        n = calls[manager.label] = calls.get(manager.label, 0) + 1
        r = {**clean_results().get(manager.label, result(4.0, 11.0, 11.0, 11.0, 11.0)), "manager": "m", "core": core}
        if manager.label == end_to_end.NUMBA_POOL.label and n == slow_round:
            r = {**r, "alloc_free_us": {k: us * 1.2 for k, us in r["alloc_free_us"].items()}}
        return r

    return measure


def test_end_to_end_flags_a_planted_slow_round_and_notes_missing_anchors(monkeypatch, capsys):
    monkeypatch.setattr(end_to_end, "measure", fake_worker(slow_round=2))
    monkeypatch.setattr(anchors, "installed", lambda label: False)
    report = {}
    flags = bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=5, baseline=None)
    out = capsys.readouterr().out
    assert {(f.label, f.table) for f in flags} == {("numba_pool", "end to end")} and len(flags) == len(worker.SIZES)
    assert "note: rmm (pool): row skipped, rmm is not installed" in out and "Traceback" not in out
    assert "CHECK FAILED [end to end] 256 B, numba_pool: rounds disagree by 20 %" in out
    assert "x faster than default" in out and report["results"]["numba_pool"]["vs_default"]["benchmark loop"] == 3.0
    assert len(report["end_to_end_notes"]) == 3 and report["results"]["numba_pool"]["core"] == 0


def test_end_to_end_anchor_that_fails_is_a_one_line_note(monkeypatch, capsys):
    monkeypatch.setattr(end_to_end, "measure", fake_worker(failing=("rmm (pool)",)))
    monkeypatch.setattr(anchors, "installed", lambda label: True)
    report = {}
    assert bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=5, baseline=None) == []
    out = capsys.readouterr().out
    assert "note: rmm (pool): row skipped, it failed: ImportError: librmm.so: cannot open shared object file" in out
    assert "Traceback" not in out and "rmm (pool)" not in report["results"] and "cupy (pool)" in report["results"]


def allocator_output(arena_ratio):
    d = {"median": arena_ratio, "low": arena_ratio - 0.05, "high": arena_ratio + 0.05}
    above = {"median": 0.4, "low": 0.3, "high": 0.5}
    rows = {"numba_pool arena": {"median_us": 1.4, "above_reference": above, "above_floor": above,
                                 "ratio_to_floor": d, "vs_baseline": None, "vs_plain": None},
            "Numba alone": {"median_us": 1.0, "above_reference": None, "above_floor": None,
                            "ratio_to_floor": None, "vs_baseline": None, "vs_plain": None}}
    return {"sizes": {"256": rows}, "notes": ["cupy (pool): row skipped, cupy is not installed"], "core": 0, **SAID}


def test_repeat_run_shows_each_run_and_flags_runs_that_disagree(monkeypatch, capsys):
    outputs = iter([allocator_output(0.70), allocator_output(0.80)])
    seen = []
    monkeypatch.setattr(launch, "run_module", lambda *command: seen.append(command) or next(outputs))
    report = {}
    flags = bench_report.allocator_part(report, Setting("GPU", "today", 3, "numba-cuda"), baseline=None,
                                        plain_pool=False, anchors=True, runs=2)
    out = capsys.readouterr().out
    assert seen == [("numba_pool_tools.bench.allocator_cost", ["--anchors"], {timing.CORE_VARIABLE: "3"})] * 2
    assert "run 1/2" in out and "run 2/2" in out and out.count("note: cupy (pool)") == 1
    assert [(f.table, f.label) for f in flags] == [("allocator runs", "numba_pool arena")]
    assert "CHECK FAILED [allocator runs] 256 B, numba_pool arena: ratios of the runs disagree by 14 %" in out
    assert len(report["allocator_runs"]) == 2 and report["allocator"] == report["allocator_runs"][0]


def test_ratios_to_default_pair_rounds_so_a_slow_spell_of_both_cancels():
    # Round 2 ran in a slow spell of the machine: both rows 1.5x slower.  In two rounds of
    # three the pool is 10x faster; a ratio of the medians over rounds (100 / 12) says 8.3x.
    def rounds(seed, values):
        merged = device_tables.median_over_rounds([{**result(seed, *([v] * len(worker.SIZES))), "manager": "m"}
                                           for v in values])
        return merged

    results = {"default": rounds(10.0, [100.0, 150.0, 100.0]), "numba_pool": rounds(1.0, [10.0, 15.0, 12.0])}
    ratios = device_tables.ratios_to_default(results)
    assert ratios["numba_pool"]["256"] == pytest.approx(10.0)
    assert device_tables.paired_ratio([100.0, 150.0, 130.0], [10.0, 15.0, 10.0]) == pytest.approx(10.0)


def test_workers_are_pinned_to_the_core_from_their_start(tmp_path):
    (tmp_path / "affinity_probe.py").write_text(
        "import json, os\nprint(json.dumps(sorted(os.sched_getaffinity(0))))\n")
    core = max(os.sched_getaffinity(0))
    assert launch.run_module("affinity_probe", [], {timing.CORE_VARIABLE: str(core)}, str(tmp_path)) == [core]
    assert launch.run_module("affinity_probe", [], {}, str(tmp_path)) == sorted(os.sched_getaffinity(0))


def test_repeat_run_end_to_end_warms_up_untimed_then_flags_ratios_that_move_between_runs(monkeypatch, capsys):
    measure = fake_worker()
    calls = []

    def timed_worker(manager, core=None, warm_up=False):
        calls.append(manager.label)
        r = measure(manager, core)
        n = calls.count(manager.label)
        assert warm_up == (n == 1)  # the warm-up round's workers, and only they, time each figure once
        if n == 1:  # the warm-up round: far off, and must not count
            r = {**r, "alloc_free_us": {k: us * 5 for k, us in r["alloc_free_us"].items()}}
        if manager.label == end_to_end.NUMBA_POOL.label and n > 3:  # run 2 (rounds 4, 5): 20 % slower
            r = {**r, "alloc_free_us": {k: us * 1.2 for k, us in r["alloc_free_us"].items()}}
        return r

    monkeypatch.setattr(end_to_end, "measure", timed_worker)
    monkeypatch.setattr(anchors, "installed", lambda label: False)
    report = {}
    flags = bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=2, baseline=None,
                                         host_rows=False, runs=2, warm_up=1)
    out = capsys.readouterr().out
    assert calls.count("default") == 5  # 1 warm-up + 2 runs x 2 rounds
    assert [(f.table, f.figure, f.label) for f in flags] == [("end to end runs", str(s), "numba_pool")
                                                             for s in worker.SIZES]
    assert "CHECK FAILED [end to end runs] 256 B, numba_pool: ratios to default of the runs disagree by 20 %" in out
    assert "x faster than default, run by run" in out and "date: today; run 2/2" in out
    assert len(report["end_to_end_runs"]) == 2 and report["results"] == report["end_to_end_runs"][0]["results"]
    assert report["results"]["numba_pool"]["rounds_alloc_free_us"]["256"] == [10.0, 10.0]  # no warm-up figure


def test_each_run_keeps_its_own_notes(monkeypatch, capsys):
    monkeypatch.setattr(end_to_end, "measure", fake_worker())
    monkeypatch.setattr(anchors, "installed", lambda label: False)
    report = {}
    bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=1, baseline=None,
                                 host_rows=False, runs=2)
    for run in report["end_to_end_runs"]:
        assert sum("one round" in note for note in run["end_to_end_notes"]) == 1


@pytest.mark.parametrize("seconds_per_pair, pairs",
                         [(205e-6, worker.MIN_PAIRS), (44e-6, 341), (13e-6, worker.MAX_PAIRS)])
def test_device_array_pairs_per_repeat_follow_the_time_budget(seconds_per_pair, pairs):
    # Numba's own 64 MiB pair (~205 us) gets the minimum, a pool's (~13 us) the maximum.
    assert timing.count_for(seconds_per_pair, worker.PAIRS_BUDGET_S, worker.MIN_PAIRS, worker.MAX_PAIRS) == pairs


def test_worker_repeats_come_from_their_variable_else_the_default():
    assert timing.worker_repeats(15, {}) == 15
    assert timing.worker_repeats(15, {timing.REPEATS_VARIABLE: " 1 "}) == 1


@pytest.mark.parametrize("value", ["0", "-2", "many", "1.5", "\u00b2"])
def test_a_bad_repeats_value_is_one_line_naming_the_variable(value):
    with pytest.raises(SystemExit) as exc:
        timing.worker_repeats(15, {timing.REPEATS_VARIABLE: value})
    assert str(exc.value) == f"bench: {timing.REPEATS_VARIABLE}={value!r}: expected a positive number of repeats"


def test_only_warm_up_workers_get_one_repeat_and_an_inherited_count_is_dropped(monkeypatch):
    seen = []
    monkeypatch.setattr(launch, "run_module", lambda module, args, env, cwd: seen.append(env) or SAID)
    end_to_end.measure(end_to_end.DEFAULT, 2, warm_up=True)
    end_to_end.measure(end_to_end.DEFAULT, 2)
    assert seen[0][timing.REPEATS_VARIABLE] == "1" and timing.REPEATS_VARIABLE not in seen[1]
    monkeypatch.setenv(timing.REPEATS_VARIABLE, "3")  # left in the user's shell: must not reach timed rounds
    argv, env, cwd = launch.command("numba_pool_tools.bench", [], {timing.CORE_VARIABLE: "2"}, None)
    assert timing.REPEATS_VARIABLE not in env and env[timing.CORE_VARIABLE] == "2"


def test_a_worker_imports_our_tools_and_numba_pool_from_anywhere_a_baseline_its_own_numba_pool(tmp_path):
    import numba_pool
    import numba_pool_tools

    argv, env, cwd = launch.command(launch.WORKER_PACKAGE, [], {}, None)
    tools_parent = os.path.dirname(os.path.dirname(numba_pool_tools.__file__))
    assert argv[1:] == ["-m", "numba_pool_tools.bench"] and cwd == tools_parent
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [tools_parent, os.path.dirname(os.path.dirname(numba_pool.__file__))]
    code = "import numba_pool, numba_pool_tools; print(numba_pool.__file__, numba_pool_tools.__file__)"
    baseline = tmp_path / "baseline"
    (baseline / "numba_pool").mkdir(parents=True)
    (baseline / "numba_pool" / "__init__.py").write_text("")
    for folder, pool in [(None, numba_pool.__file__), (str(baseline), str(baseline / "numba_pool" / "__init__.py"))]:
        _, env, cwd = launch.command(launch.WORKER_PACKAGE, [], {}, folder)
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
        assert proc.stdout.split() == [pool, numba_pool_tools.__file__], proc.stderr


def test_a_baseline_from_before_the_tools_moved_out_runs_its_own_bench(tmp_path):
    assert {m.module for m in end_to_end.baselines(str(tmp_path))} == {"numba_pool_tools.bench"}
    (tmp_path / "numba_pool" / "bench").mkdir(parents=True)  # numba_pool/bench/: the old layout
    assert {m.module for m in end_to_end.baselines(str(tmp_path))} == {"numba_pool.bench"}
    assert [m.cwd for m in end_to_end.baselines(str(tmp_path))] == [str(tmp_path)] * 2


def test_cached_jit_falls_back_to_plain_jit_where_numba_cannot_cache(monkeypatch):
    cuda = core.cuda  # the bench's frontend's
    asked = []

    def jit(func=None, **options):
        asked.append(options)
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file '<stdin>'")
        return ("compiled", func)

    monkeypatch.setattr(cuda, "jit", jit)

    def f():
        pass

    assert timing.cached_jit(f) == ("compiled", f) and asked == [{"cache": True}, {}]


@pytest.mark.skipif("numba-cuda" not in FRONTENDS, reason=MISSING_FRONTENDS.get("numba-cuda", ""))
def test_seed_kernels_through_cached_jit_compute_what_the_seed_kernels_do(tmp_path):
    # Under numba-cuda's simulator (no GPU in CI), which compiles nothing and so caches nothing:
    # this checks that the kernels are the seed kernels; on a GPU the bench's own checks run them.
    code = ("import numpy as np; from numba_pool_tools.bench import timing\n"
            "fill, sqrt = timing.seed_kernels()\n"
            "a = np.arange(64, dtype=np.float32); sqrt[1, 64](a)\n"
            "b = np.zeros(64, dtype=np.float32); fill[1, 64](b, np.float32(3))\n"
            "assert np.allclose(a, np.sqrt(np.arange(64))) and (b == 3).all() and timing.seed_kernels()[0] is fill\n")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "NUMBA_CACHE_DIR": str(tmp_path),
           core.FRONTEND_VARIABLE: "numba-cuda"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=PACKAGE_PARENT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_each_device_array_repeat_carries_out_the_frees_numba_holds_back_then_synchronizes(monkeypatch):
    cuda = core.cuda  # the bench's frontend's
    done = []
    pending = SimpleNamespace(clear=lambda: done.append("pending frees"))
    monkeypatch.setattr(cuda, "current_context", lambda: SimpleNamespace(memory_manager=SimpleNamespace(
        deallocations=pending)))
    monkeypatch.setattr(cuda, "device_array", lambda n, dtype: done.append(n))
    monkeypatch.setattr(cuda, "synchronize", lambda: done.append("synchronize"))
    worker.device_array_pairs(64, 3)()
    assert done == [64, 64, 64, "pending frees", "synchronize"]


def test_pairs_per_repeat_of_each_round_are_kept():
    rounds = [{**result(4.0, 11.0, 11.0, 11.0, 11.0), "manager": "m", "pairs": {"256": 1000, "67108864": 100}}] * 2
    assert device_tables.median_over_rounds(rounds)["rounds_pairs"] == [{"256": 1000, "67108864": 100}] * 2


@pytest.mark.parametrize("manager, handle", [
    (SimpleNamespace(allocator=SimpleNamespace(pool=SimpleNamespace(handle="pool"))), "pool"),  # numba_pool's
    (SimpleNamespace(allocator=None), None),  # not initialized
    (SimpleNamespace(_pool=object()), None),  # another plugin's pool (CuPy's)
    (object(), None),  # Numba's own manager
], ids=["allocator", "uninitialized", "other-pool", "none"])
def test_the_driver_pair_is_timed_on_numba_pools_own_pool_only(manager, handle):
    assert core.pool_handle(manager) == handle


def test_a_failed_worker_stops_the_bench_with_its_error_unless_it_is_an_anchor(monkeypatch):
    monkeypatch.setattr(end_to_end, "measure", fake_worker(failing=("numba_pool", "rmm (pool)")))
    managers, notes = [end_to_end.DEFAULT, end_to_end.RMM, end_to_end.NUMBA_POOL], []
    with pytest.raises(bench_report.BenchError, match=r"^benchmark of numba_pool failed: exit 1:\nTraceback"):
        bench_report.one_round(managers, 0, notes, "round 1/1")
    assert [m.label for m in managers] == ["default", "numba_pool"] and notes[0].startswith("rmm (pool): row skipped")


def test_a_failed_allocator_run_stops_the_bench_with_its_error(monkeypatch):
    def failing(module, args, env):
        raise RuntimeError("exit 1:\nRuntimeError: cuMemPoolCreate failed")

    monkeypatch.setattr(launch, "run_module", failing)
    with pytest.raises(bench_report.BenchError, match="^exit 1:\nRuntimeError: cuMemPoolCreate failed$"):
        bench_report.allocator_part({}, SETTING, baseline=None, plain_pool=False, anchors=False, runs=1)
