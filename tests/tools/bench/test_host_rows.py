"""The bench's host rows (``pinned_array``/``mapped_array`` allocate+free, the batch pipeline)
without a GPU: the worker's arguments, counts and turns, the pipeline's arithmetic, reading the
workers' figures back, medians over rounds, ratios, self-checks, tables and the JSON report.
The worker's code runs once under numba-cuda's CUDA simulator (small sizes), in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from end_to_end_fakes import SETTING, clean_results, result
from helpers import FRONTENDS, MISSING_FRONTENDS, PACKAGE_PARENT
from numba_pool.cuda import frontend as frontends
from numba_pool_tools.bench import anchors, checks, core, end_to_end, launch, timing
from numba_pool_tools.bench import host_tables as t
from numba_pool_tools.bench import host_worker as h
from numba_pool_tools.bench import report as bench_report

S4K, S1M, S64M = (str(s) for s in h.SIZES)


# -- the worker's side, no GPU ----------------------------------------------------------------------

@pytest.mark.parametrize("argv, parts", [([], ()), (["--host", "pinned,pipeline"], ("pinned", "pipeline")),
                                         (["--host", "pipeline, pinned"], ("pinned", "pipeline")),
                                         (["--host", "pipeline"], ("pipeline",)), (["--host", ""], ())])
def test_worker_parts_come_from_its_arguments(argv, parts):
    assert h.parse_parts(argv) == parts
    assert h.parse_arguments(argv) == (parts, True)  # the cuda.device_array part unless --no-device


def test_an_unknown_part_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        h.parse_parts(["--host", "pinned,pipline"])
    assert exit_.value.code == 2
    assert "--host: unknown part 'pipline' (known: pinned, pipeline, managed, managed-pipeline)" in capsys.readouterr().err


def test_the_worker_module_refuses_an_unknown_part_before_touching_cuda():
    proc = subprocess.run([sys.executable, "-m", "numba_pool_tools.bench", "--host", "bogus"], cwd=PACKAGE_PARENT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "unknown part 'bogus'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("seconds_per_op, count", [(1.3e-3, 24), (46e-3, h.MIN_COUNT), (5e-6, h.MAX_COUNT),
                                                   (0.0, h.MAX_COUNT), (0.01, 3), (0.0075, 4)])
def test_count_per_repeat_is_time_budgeted_within_bounds(seconds_per_op, count):
    assert timing.count_for(seconds_per_op, h.BUDGET_S, h.MIN_COUNT, h.MAX_COUNT) == count


def test_calibration_warms_up_then_times_the_minimum_count(monkeypatch):
    made = []
    monkeypatch.setattr(timing, "elapsed", lambda body: body() or 3 * 2e-3)  # 2 ms per operation
    count, body = timing.calibrated(lambda n: made.append(n) or (lambda: None), 0.03, h.MIN_COUNT, h.MAX_COUNT)
    assert made == [h.MIN_COUNT, 15] and count == 15


def test_cells_are_calibrated_then_take_turns_and_report_per_operation():
    order = []

    def cell(name):
        return lambda count: (lambda: order.append((name, count)))

    result = {"counts": {}}
    h.time_cells(result, {(h.PINNED, 4096): cell("a"), (h.PIPELINE, 4096): cell("b")}, repeats=3, budget_s=0.0)
    assert order[:4] == [("a", 3), ("a", 3), ("b", 3), ("b", 3)]  # warm-up, then timed, per cell
    assert order[4:] == [("a", 3), ("b", 3)] * 3  # the cells take turns in each repeat
    assert result["counts"] == {h.PINNED: {"4096": 3}, h.PIPELINE: {"4096": 3}}
    assert result[h.PINNED]["4096"] > 0 and result[h.PIPELINE]["4096"] > 0


def _batch_by_hand(x):
    """The two kernels, element by element, as written in tools/numba_pool_tools/bench/host_worker.py."""
    small_n = h.SMALL_TEMPORARY // 4
    n = len(x)
    full = [2.0 * x[i] for i in range(n)]
    half = [x[2 * j] + x[2 * j + 1] for j in range(n // 2)]
    small = [k % 7 for k in range(small_n)]
    return np.array([full[i] + half[i // 2] + small[i % small_n] for i in range(n)], dtype=np.float32)


@pytest.mark.parametrize("n", [8, 1024, 3000])
def test_the_pipeline_check_expects_what_the_kernels_compute(n):
    source = h.source_for(n)
    assert source.dtype == np.float32 and source.max() < 1000
    assert np.array_equal(h.expected_batch(source), _batch_by_hand(source.astype(np.float64)))


def _numba(frontend_name: str) -> object:
    """A manager with the frontend's own memhostalloc (a cuMemHostAlloc per array), nothing
    else: only its type is looked at."""
    base = frontends.load(frontend_name).HostOnlyCUDAMemoryManager
    numba = type("_Numba", (base,), {})
    numba.__abstractmethods__ = frozenset()
    return numba.__new__(numba)


class _Overrides:
    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        raise NotImplementedError


def test_where_pinned_memory_comes_from_is_said_in_words(frontend_name):
    from types import SimpleNamespace

    def source(manager):
        return h.memory_source(manager, h.PINNED_MEMORY)

    assert source(None) == "no memory manager (the CUDA simulator)"
    assert source(SimpleNamespace(host=object())) == "numba_pool host cache"
    assert source(_Overrides()) == f"{__name__}._Overrides.memhostalloc"
    assert source(_numba(frontend_name)) == "cuMemHostAlloc per array"  # either frontend's own


SIMULATED = """
import json, sys
from numba_pool_tools.bench import host_worker as h
from numba_pool_tools.bench.core import cuda
from numba.cuda.simulator.cudadrv.devicearray import managed_array

cuda.managed_array = managed_array  # the simulator has one (a NumPy array), but does not export it
if sys.argv[1] == "planted":
    @cuda.jit
    def combine(full, half, small):  # forgets to add: the output must be refused
        pass

    h.combine = combine
if sys.argv[1] == "planted-managed":
    @cuda.jit
    def increment(a):  # forgets to increment: the managed check must refuse
        pass

    h.example_kernel = lambda name: increment
h.check(h.PARTS, sizes=[4096])
print(json.dumps(h.measure(h.PARTS, sizes=[4096], repeats=1, budget_s=0.0)))
"""


def _simulated(mode: str) -> subprocess.CompletedProcess:
    if "numba-cuda" not in FRONTENDS:  # the simulator is numba-cuda's
        pytest.skip(MISSING_FRONTENDS["numba-cuda"])
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", frontends.VARIABLE: "numba-cuda"}
    return subprocess.run([sys.executable, "-c", SIMULATED, mode], env=env, cwd=PACKAGE_PARENT, capture_output=True,
                          text=True, timeout=600)


def test_the_worker_checks_and_times_under_the_simulator_and_its_output_reads_back():
    proc = _simulated("clean")
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = t.host_figures({"host": json.loads(proc.stdout.strip().splitlines()[-1])})
    assert set(figures[h.PINNED]) == set(figures[h.MAPPED]) == set(figures[h.PIPELINE]) == {"4096"}
    assert set(figures[h.MANAGED]) == set(figures[h.MANAGED_PIPELINE]) == {"4096"}  # the managed parts too
    assert figures["counts"][h.PIPELINE] == {"4096": h.MIN_COUNT} and figures["repeats"] == 1
    assert figures["counts"][h.MANAGED_PIPELINE] == {"4096": h.MIN_COUNT}
    assert figures["host_cache"] is False and figures["pinned_from"] == "no memory manager (the CUDA simulator)"
    assert figures["managed_cache"] is False and figures["managed_from"] == "no memory manager (the CUDA simulator)"


def test_a_wrong_pipeline_output_is_refused_before_timing():
    proc = _simulated("planted")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "bench: the batch pipeline's output is wrong at 4 KiB: refusing to time" in proc.stderr


def test_a_managed_array_the_kernel_did_not_increment_is_refused_before_timing():
    proc = _simulated("planted-managed")
    assert proc.returncode == 1 and proc.stdout == ""
    assert ("bench: a managed array's data is wrong after the host's writes, the increment kernel and the host's "
            "read at 4 KiB: refusing to time") in proc.stderr


# -- the parent's side: reading figures, rounds, ratios, checks ------------------------------------

def host(pinned=None, mapped=None, pipeline=None, cache=False, counts=3, repeats=9, source=None):
    """A worker's ``host`` object: each figure a list of three times (4 KiB, 1 MiB, 64 MiB)."""
    out = {"repeats": repeats, "host_cache": cache, "counts": {},
           "pinned_from": source or ("numba_pool host cache" if cache else "cuMemHostAlloc per array")}
    for field, values in ((h.PINNED, pinned), (h.MAPPED, mapped), (h.PIPELINE, pipeline)):
        if values is not None:
            out[field] = dict(zip((S4K, S1M, S64M), values))
            out["counts"][field] = dict.fromkeys((S4K, S1M, S64M), counts)
    return out


DEFAULT = host([1320.0, 1330.0, 46000.0], [1400.0, 1410.0, 47000.0], [3.1, 4.2, 131.0])
POOL = host([6.1, 6.2, 6.3], [9.1, 9.2, 9.3], [0.2, 0.6, 14.9], cache=True, counts=1000)
ANCHOR = host(pipeline=[3.0, 4.0, 130.0])


def merged(rows: dict) -> dict:
    """``{label: [host object per round]}`` read back and merged over rounds, as the bench does."""
    return {label: t.median_over_rounds([t.host_figures({"host": r}) for r in rounds])
            for label, rounds in rows.items()}


def test_host_figures_read_back_and_none_without_them():
    assert t.host_figures({"seed_loop_ms": 1.0}) is None
    figures = t.host_figures({"host": POOL})
    assert figures[h.PINNED] == {S4K: 6.1, S1M: 6.2, S64M: 6.3} and figures["counts"][h.PINNED][S4K] == 1000
    assert figures["host_cache"] is True and figures["repeats"] == 9
    assert set(t.host_figures({"host": ANCHOR})) == {"repeats", "host_cache", "pinned_from", "managed_cache",
                                                     "managed_from", "counts", h.PIPELINE}


@pytest.mark.parametrize("bad, message", [
    ([], "'host' is list, not an object"),
    ({"repeats": 9}, "'host' has none of pinned_array_us, mapped_array_us, pipeline_ms, managed_array_us, "
                     "managed_pipeline_ms"),
    ({**POOL, "repeats": 0}, "repeats = 0 is not a positive count"),
    ({**POOL, h.PINNED: {}}, "pinned_array_us is not a non-empty object of sizes"),
    ({**POOL, h.PINNED: {"4 KiB": 6.1}}, "pinned_array_us: '4 KiB' is not a size in bytes"),
    ({**POOL, h.PIPELINE: {S4K: -0.2}}, "pipeline_ms[4096] = -0.2 is not a positive time"),
    ({**POOL, h.PIPELINE: {S4K: "0.2"}}, "pipeline_ms[4096] = '0.2' is not a positive time"),
    ({**POOL, h.MAPPED: {S4K: float("nan")}}, "mapped_array_us[4096] = nan is not a positive time"),
    ({**POOL, h.MAPPED: {S4K: True}}, "mapped_array_us[4096] = True is not a positive time"),
    ({**POOL, "counts": {h.PINNED: {S4K: 2.5}}}, "counts.pinned_array_us[4096] = 2.5 is not a positive count"),
])
def test_malformed_host_figures_are_named(bad, message):
    with pytest.raises(ValueError) as err:
        t.host_figures({"host": bad})
    assert message in str(err.value)


def test_collect_keeps_the_asked_rows_and_notes_the_rest():
    per_round = {"default": [{"host": DEFAULT}] * 2, "numba_pool": [{"host": POOL}, {"host": POOL}],
                 "no-op floor": [{}, {}], "numba_pool (baseline)": [{}, {}],
                 "cupy (pool)": [{"host": {**ANCHOR, h.PIPELINE: {S4K: 0}}}]}
    rounds, notes = t.collect(per_round, {"default", "numba_pool", "numba_pool (baseline)", "cupy (pool)"})
    assert list(rounds) == ["default", "numba_pool"] and len(rounds["numba_pool"]) == 2
    assert notes == ["numba_pool (baseline): no host rows, its worker returned none (a numba_pool without bench_host?)",
                     "cupy (pool): no host rows, its worker's host figures are unreadable: "
                     "pipeline_ms[4096] = 0 is not a positive time"]


def test_rounds_give_medians_and_are_kept_beside_them():
    slow = host([6.1, 6.2, 6.3], [9.1, 9.2, 9.3], [0.3, 0.6, 14.9], cache=True, counts=900)
    uncached = {**POOL, "host_cache": False}
    m = merged({"numba_pool": [POOL, slow, uncached]})["numba_pool"]
    assert m[h.PIPELINE][S4K] == 0.2 and m[f"rounds_{h.PIPELINE}"][S4K] == [0.2, 0.3, 0.2]
    assert m[f"counts_{h.PIPELINE}"][S4K] == [1000, 900, 1000] and m["rounds"] == 3 and m["repeats"] == 9
    assert m["host_cache"] is False and m["pinned_from"] == "numba_pool host cache"
    partial = host([6.1, 6.2, 6.3], [9.1, 9.2, 9.3], [0.2, 0.6, 14.9], cache=True)
    del partial[h.PINNED][S64M]
    assert S64M not in merged({"numba_pool": [POOL, partial]})["numba_pool"][h.PINNED]  # not in every round


def test_ratios_to_default_per_cell_and_none_without_default():
    results = merged({"default": [DEFAULT], "numba_pool": [POOL], "cupy (pool)": [ANCHOR]})
    ratios = t.ratios_to_default(results)
    assert ratios["numba_pool"][h.PINNED][S64M] == pytest.approx(46000 / 6.3)
    assert ratios["numba_pool"][h.PIPELINE][S4K] == pytest.approx(3.1 / 0.2)
    assert ratios["default"][h.MAPPED][S1M] == 1.0
    assert ratios["cupy (pool)"] == {h.PIPELINE: {S4K: pytest.approx(3.1 / 3.0), S1M: 4.2 / 4.0, S64M: 131.0 / 130.0}}
    assert t.ratios_to_default(merged({"numba_pool": [POOL]})) == {}


def test_rounds_more_than_ten_percent_apart_are_flagged_per_cell():
    within = host([6.5, 6.2, 6.3], [9.1, 9.2, 9.3], [0.21, 0.6, 14.9], cache=True)
    assert t.rounds_flags(merged({"numba_pool": [POOL, within, POOL]})) == []
    outlier = host([6.1, 6.2, 7.0], [9.1, 9.2, 9.3], [0.2, 0.6, 17.0], cache=True)
    flags = t.rounds_flags(merged({"numba_pool": [POOL, outlier, POOL]}))
    assert [(f.table, f.figure, f.label) for f in flags] == [("pinned alloc+free", "pinned_array 64 MiB", "numba_pool"),
                                                             ("batch pipeline", "batch 64 MiB", "numba_pool")]
    assert str(flags[1]) == ("CHECK FAILED [batch pipeline] batch 64 MiB, numba_pool: rounds disagree by 14 % "
                             "(max/min 1.141 > 1.10): 14.9, 17, 14.9")


def test_a_row_run_with_the_host_cache_that_did_not_use_it_is_flagged():
    results = merged({"numba_pool": [POOL, {**POOL, "host_cache": False}], "default": [DEFAULT],
                      "cupy (pool)": [ANCHOR]})
    flags = t.cache_flags(results, {"numba_pool"})  # default and the anchors: Numba's, as expected
    assert [(f.table, f.figure, f.label) for f in flags] == [("pinned alloc+free", "every size", "numba_pool"),
                                                             ("batch pipeline", "every size", "numba_pool")]
    assert "did not come from numba_pool's host cache although NUMBA_POOL_HOST=1" in flags[0].message
    assert t.cache_flags(merged({"numba_pool": [POOL]}), {"numba_pool"}) == []
    assert t.cache_flags(results, {"numba_pool"}, h.MANAGED_MEMORY) == []  # no managed figures: no managed flag


# -- the tables -------------------------------------------------------------------------------------

def cells(table: str, label: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {label} "))
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.parametrize("value, text", [(5.2, "5.200"), (46012.3, "46012"), (0.08123, "0.08123"), (131.04, "131.0"),
                                         (1320.4, "1320"), (0.0, "0")])
def test_figures_keep_four_significant_digits(value, text):
    assert t.significant(value) == text


@pytest.mark.parametrize("ratio, text", [(1.0, "1.00x"), (2.914, "2.91x"), (25.34, "25.3x"), (4512.2, "4512x")])
def test_ratios_read_as_times_faster(ratio, text):
    assert t.times(ratio) == text


def test_pinned_table_rows_cells_and_ratios():
    results = merged({"default": [DEFAULT], "numba_pool": [POOL], "cupy (pool)": [ANCHOR]})
    table = t.render(t.HOST_TABLE, results)
    header = table.splitlines()[0]
    assert "pinned memory from" in header and "pinned_array 4 KiB us (x faster)" in header
    assert "mapped_array 64 MiB us (x faster)" in header
    assert cells(table, "default")[1:] == ["cuMemHostAlloc per array", "1320 (1.00x)", "1330 (1.00x)", "46000 (1.00x)",
                                           "1400 (1.00x)", "1410 (1.00x)", "47000 (1.00x)"]
    assert cells(table, "numba_pool")[1:4] == ["numba_pool host cache", "6.100 (216x)", "6.200 (215x)"]
    assert cells(table, "numba_pool")[4] == "6.300 (7302x)"
    assert "| cupy (pool) " not in table  # the anchors run the pipeline only


def test_pipeline_table_has_the_anchors_and_marks_flagged_cells():
    results = merged({"default": [DEFAULT], "numba_pool": [POOL], "cupy (pool)": [ANCHOR]})
    flags = [checks.Flag(t.PIPELINE_TABLE, "batch 1 MiB", "numba_pool", "rounds disagree")]
    table = t.render(t.PIPELINE_TABLE, results, flags)
    assert "batch 4 KiB ms (x faster)" in table.splitlines()[0]
    assert cells(table, "numba_pool")[2:] == ["0.2000 (15.5x)", "0.6000 (7.00x) !", "14.90 (8.79x)"]
    assert cells(table, "cupy (pool)")[1:] == ["cuMemHostAlloc per array", "3.000 (1.03x)", "4.000 (1.05x)",
                                               "130.0 (1.01x)"]
    assert "!" not in t.render(t.HOST_TABLE, results, flags)  # a flag marks its own table only


def test_a_row_flag_marks_every_cell_of_the_row_and_nothing_is_clean_beside_it():
    results = merged({"default": [DEFAULT], "numba_pool": [POOL]})
    flags = t.cache_flags({**results, "numba_pool": {**results["numba_pool"], "host_cache": False}}, {"numba_pool"})
    table = t.render(t.HOST_TABLE, results, flags)
    assert all(cell.endswith(" !") for cell in cells(table, "numba_pool")[2:])
    assert not any(cell.endswith("!") for cell in cells(table, "default"))


def test_tables_without_default_have_no_ratios_and_missing_cells_show_a_dash():
    partial = host([6.1, 6.2, 6.3], [9.1, 9.2, 9.3], None, cache=True)
    del partial[h.MAPPED][S1M], partial["counts"][h.MAPPED][S1M]
    table = t.render(t.HOST_TABLE, merged({"numba_pool": [partial]}))
    assert "x faster" not in table and cells(table, "numba_pool")[2:] == ["6.100", "6.200", "6.300", "9.100", "-",
                                                                           "9.300"]
    assert t.render(t.PIPELINE_TABLE, merged({"numba_pool": [partial]})).count("\n") == 1  # headers only: no pipeline figures


# -- which worker runs what, and the end-to-end part with the workers faked ----------------------------

def test_plan_gives_each_worker_its_parts_and_numba_pool_the_host_cache():
    managers = [end_to_end.DEFAULT, end_to_end.NUMBA_POOL, end_to_end.ARENA, end_to_end.FLOOR, end_to_end.BARE_FLOOR,
                end_to_end.CUPY,
                *end_to_end.baselines("/elsewhere")]
    planned, notes = t.plan(managers, (h.PINNED_MEMORY,), known=lambda cwd: h.PARTS)
    by_label = {m.label: m for m in planned}
    assert by_label["default"].args == ("--host", "pinned,pipeline")
    assert "NUMBA_POOL_HOST" not in by_label["default"].env
    for label in ("numba_pool", "numba_pool arena", "numba_pool (baseline)", "numba_pool arena (baseline)"):
        assert by_label[label].args == ("--host", "pinned,pipeline") and by_label[label].env["NUMBA_POOL_HOST"] == "1"
    assert by_label["numba_pool arena"].env["NUMBA_POOL_ARENA"] == "1"
    assert by_label["numba_pool (baseline)"].cwd == "/elsewhere"
    assert by_label["no-op floor"] is end_to_end.FLOOR and by_label["Numba alone"] is end_to_end.BARE_FLOOR
    assert by_label["cupy (pool)"].args == ("--host", "pipeline")
    assert "NUMBA_POOL_HOST" not in by_label["cupy (pool)"].env
    assert end_to_end.NUMBA_POOL.args == () and "NUMBA_POOL_HOST" not in end_to_end.NUMBA_POOL.env  # constants unchanged
    assert notes == [t.FLOORS_NOTE, "cupy (pool): batch pipeline only: their pinned memory is Numba's own, as "
                     "default's (pinned_array and mapped_array rows would time default's path again)"]
    assert t.plan([end_to_end.DEFAULT, end_to_end.NUMBA_POOL], (h.PINNED_MEMORY,))[1] == []
    assert all("NUMBA_POOL_MANAGED" not in m.env for m in planned)  # pinned rows only: managed left as it is


def test_measure_hands_the_worker_its_arguments(monkeypatch):
    seen = []
    said = {"frontend": core.FRONTEND.name}  # what a worker says it ran under
    monkeypatch.setattr(launch, "run_module", lambda module, args, env, cwd: seen.append((module, args, env)) or said)
    planned, _ = t.plan([end_to_end.ARENA, end_to_end.FLOOR], (h.PINNED_MEMORY,))
    for manager in planned:
        end_to_end.measure(manager, core=2)
    assert [(m, a) for m, a, _ in seen] == [("numba_pool_tools.bench", ["--host", "pinned,pipeline"]),
                                            ("numba_pool_tools.bench", [])]
    assert seen[0][2]["NUMBA_POOL_HOST"] == "1" and "NUMBA_POOL_HOST" not in seen[1][2]


def fake_worker(slow_round=None, uncached=False):
    """An end_to_end.measure stand-in whose workers return host figures when asked (args), and records
    what each was given; numba_pool's 64 MiB batch 20 % slower in round ``slow_round``."""
    seen, calls = [], {}
    rows = {"default": DEFAULT, "numba_pool": POOL, "numba_pool arena": POOL}

    def measure(manager, core=None, warm_up=False):
        seen.append(manager)
        n = calls[manager.label] = calls.get(manager.label, 0) + 1
        r = {**clean_results().get(manager.label, result(4.0, 11.0, 11.0, 11.0, 11.0)), "manager": "m", "core": core}
        if manager.args:
            figures = json.loads(json.dumps(rows.get(manager.label, ANCHOR)))
            if manager.args[1] == "pipeline":
                figures = {k: v for k, v in figures.items() if k not in (h.PINNED, h.MAPPED)}
            if manager.label == "numba_pool" and n == slow_round:
                figures[h.PIPELINE][S64M] *= 1.2
            if manager.label == "numba_pool arena" and uncached:
                figures.update(host_cache=False, pinned_from="cuMemHostAlloc per array")
            r["host"] = figures
        return r

    return measure, seen


def test_end_to_end_prints_the_host_tables_and_fills_the_json_report(monkeypatch, capsys):
    measure, seen = fake_worker(slow_round=2)
    monkeypatch.setattr(end_to_end, "measure", measure)
    monkeypatch.setattr(anchors, "installed", lambda label: label == "cupy (pool)")
    report = {}
    flags = bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=3, baseline=None,
                                         managed_rows=False)
    out = capsys.readouterr().out
    assert [(f.table, f.figure, f.label) for f in flags] == [("batch pipeline", "batch 64 MiB", "numba_pool")]
    assert "numba_pool rows with NUMBA_POOL_HOST=1, which these figures do not use" in out
    assert "pinned host memory end to end" in out and "batch pipeline end to end" in out
    assert "| numba_pool       | numba_pool host cache    | 6.100 (216x)" in out
    assert "17.88 (7.33x) !" not in out and "14.90 (8.79x) !" in out  # the median of 14.9, 17.88, 14.9, flagged
    assert "CHECK FAILED [batch pipeline] batch 64 MiB, numba_pool: rounds disagree by 20 %" in out
    assert f"note: {t.FLOORS_NOTE}" in out and "note: cupy (pool): batch pipeline only" in out
    assert {m.label for m in seen if not m.args} == {"no-op floor", "Numba alone"}
    json.dumps(report)  # the --json file
    assert list(report["host_results"]) == ["default", "numba_pool", "numba_pool arena", "cupy (pool)"]
    pool = report["host_results"]["numba_pool"]
    assert pool[h.PINNED] == {S4K: 6.1, S1M: 6.2, S64M: 6.3} and pool["rounds"] == 3
    assert pool[f"rounds_{h.PIPELINE}"][S64M] == [14.9, pytest.approx(17.88), 14.9]
    assert pool["vs_default"][h.PINNED][S4K] == pytest.approx(1320 / 6.1)
    assert h.PINNED not in report["host_results"]["cupy (pool)"]
    assert report["host_notes"][0] == t.FLOORS_NOTE
    assert report["worker_env"]["numba_pool"]["NUMBA_POOL_HOST"] == "1"
    assert len(report["worker_seconds"]["default"]) == 3


def test_end_to_end_flags_a_numba_pool_row_whose_pinned_memory_was_numbas(monkeypatch, capsys):
    measure, _ = fake_worker(uncached=True)
    monkeypatch.setattr(end_to_end, "measure", measure)
    monkeypatch.setattr(anchors, "installed", lambda label: False)
    flags = bench_report.end_to_end_part({}, SETTING, anchors=True, no_arena=False, rounds=2, baseline=None,
                                         managed_rows=False)
    assert {(f.table, f.figure, f.label) for f in flags} == {("pinned alloc+free", "every size", "numba_pool arena"),
                                                             ("batch pipeline", "every size", "numba_pool arena")}
    out = capsys.readouterr().out
    assert "| numba_pool arena | cuMemHostAlloc per array | 6.100 (216x) !" in out


def test_no_host_rows_leaves_the_workers_as_they_were(monkeypatch, capsys):
    measure, seen = fake_worker()
    monkeypatch.setattr(end_to_end, "measure", measure)
    monkeypatch.setattr(anchors, "installed", lambda label: False)
    report = {}
    assert bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=2, baseline=None,
                                        host_rows=False, managed_rows=False) == []
    out = capsys.readouterr().out
    assert all(m.args == () and "NUMBA_POOL_HOST" not in m.env for m in seen)
    assert "pinned host memory" not in out and "NUMBA_POOL_HOST" not in out and "host_results" not in report

