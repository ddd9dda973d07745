"""The overlap part of the bench (``numba-pool-tools bench --part overlap``, issue 33) without a GPU: the
worker's batches issued as the issue's pipeline is (its CUDA faked), and the parent's side with
the workers faked: figures read back, ratios to default, issue 33's targets, rounds and runs
that disagree, the table, the report and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from end_to_end_fakes import SETTING, clean_overlap_results, overlap_result
from helpers import PACKAGE_PARENT
from numba_pool_tools.bench import checks, core, end_to_end, launch, overlap, overlap_tables, timing, turns
from numba_pool_tools.bench import report as bench_report
from numba_pool_tools.cli import main

TWO, FOUR = overlap.figure(2), overlap.figure(4)
TWO_SCOPED, FOUR_SCOPED = overlap.figure(2, True), overlap.figure(4, True)
POOLS = ("numba_pool", "numba_pool arena")


def merged(fakes: dict, rounds: int = 3) -> dict:
    """The parent's results of ``{label: worker figures}``, each the same in every round."""
    return overlap_tables.merge({label: [r] * rounds for label, r in fakes.items()})


# -- the worker's batches ------------------------------------------------------------------------

class FakeArray:
    made = 0

    def __init__(self, log, stream):
        FakeArray.made += 1
        self.name, self.log = f"a{FakeArray.made}", log
        log.append(("allocate", stream, self.name))

    def __del__(self):
        self.log.append(("drop", self.name))


@pytest.fixture
def fake_cuda(monkeypatch):
    """The worker's ``cuda``, kernel and ``using_stream`` faked: what a batch does, in order."""
    log = []

    class Kernel:
        def __getitem__(self, configuration):
            blocks, threads, stream = configuration
            return lambda array, sleeps, value: log.append(("kernel", stream, array.name, blocks, sleeps))

    class Scope:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            log.append(("enter", self.stream))

        def __exit__(self, *exc):
            log.append(("exit", self.stream))

    fake = SimpleNamespace(device_array=lambda n, dtype, stream=None: FakeArray(log, stream))
    monkeypatch.setattr(overlap, "cuda", fake)
    monkeypatch.setattr(overlap, "spin", Kernel())
    monkeypatch.setattr(overlap, "using_stream", Scope)
    monkeypatch.setattr(overlap, "ITERATIONS", 2)
    return log


def test_a_batch_allocates_launches_and_drops_on_each_stream_in_turn_then_flushes(fake_cuda):
    overlap.pipeline(["s0", "s1"], scoped=False, flush=lambda: fake_cuda.append(("flush",)))()
    names = [event[2] for event in fake_cuda if event[0] == "allocate"]
    expected = []
    for i, stream in enumerate(["s0", "s1"] * 2):
        name = names[i]
        expected += [("allocate", stream, name), ("kernel", stream, name, 1, overlap.SLEEPS), ("drop", name)]
    assert fake_cuda == expected + [("flush",)]
    assert len(set(names)) == 4  # a temporary per kernel


def test_with_using_stream_each_allocation_and_only_it_is_inside_its_streams_scope(fake_cuda):
    overlap.pipeline(["s0", "s1", "s2", "s3"], scoped=True, flush=lambda: None)()
    kinds = [event[0] for event in fake_cuda]
    assert kinds == ["enter", "allocate", "exit", "kernel", "drop"] * 8
    for i in range(0, len(fake_cuda), 5):
        stream = fake_cuda[i][1]
        assert [e[1] for e in fake_cuda[i:i + 4]] == [stream] * 4  # scope, allocation and kernel on one stream
    assert [fake_cuda[i][1] for i in range(0, len(fake_cuda), 5)] == ["s0", "s1", "s2", "s3"] * 2


def test_the_kernels_alone_run_back_to_back_on_one_array_allocated_once(fake_cuda):
    body = overlap.serial("s0", 5, flush=lambda: fake_cuda.append(("flush",)))
    del fake_cuda[:]
    body()
    assert [e[0] for e in fake_cuda] == ["kernel"] * 5 + ["flush"]
    assert len({e[2] for e in fake_cuda[:5]}) == 1 and {e[1] for e in fake_cuda[:5]} == {"s0"}


def test_figure_names():
    assert (TWO, FOUR_SCOPED) == ("2 streams", "4 streams, using_stream")
    assert overlap.STREAMS == (2, 4) and overlap.ITERATIONS == 40 and overlap.TEMPORARY == 1 << 20


def test_the_worker_refuses_a_bad_repeats_value_before_touching_cuda():
    proc = subprocess.run([sys.executable, "-m", "numba_pool_tools.bench.overlap"], cwd=PACKAGE_PARENT,
                          env={**os.environ, timing.REPEATS_VARIABLE: "none"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"bench: {timing.REPEATS_VARIABLE}='none': expected a positive "
                                                "number of repeats"]


def test_only_numba_pools_manager_gets_a_stream_scope(monkeypatch):
    def context_with(cls):
        return lambda: SimpleNamespace(memory_manager=cls())

    NumbaPoolManager = type("NumbaPoolManager", (), {})
    monkeypatch.setattr(timing.cuda, "current_context", context_with(NumbaPoolManager))
    assert timing.serves_numba_pool()
    monkeypatch.setattr(timing.cuda, "current_context", context_with(type("NumbaCUDAMemoryManager", (), {})))
    assert not timing.serves_numba_pool()
    with timing.stream_scope(object()) as scope:  # nothing to enter: not a stream the scope checks
        assert scope is None


# -- the parent: figures, ratios, checks ---------------------------------------------------------

def test_the_managers_are_default_and_numba_pool_in_both_modes_running_the_overlap_worker():
    managers = overlap_tables.managers()
    assert [m.label for m in managers] == ["default", *POOLS]
    assert {m.module for m in managers} == {"numba_pool_tools.bench.overlap"}
    assert [m.env.get("NUMBA_POOL_ARENA") for m in managers] == [None, "0", "1"]
    assert [m.label for m in overlap_tables.managers(no_arena=True)] == ["default", "numba_pool"]
    assert end_to_end.NUMBA_POOL.module == end_to_end.WORKER  # the end-to-end part's are unchanged


def test_figures_read_back_the_worker_line():
    pool = overlap_tables.figures(overlap_result(48.0, 49.0, scoped=(41.8, 43.0)))
    assert pool == {"using_stream": True, "batch_ms": {TWO: 48.0, FOUR: 49.0, TWO_SCOPED: 41.8, FOUR_SCOPED: 43.0},
                    "serial_ms": {TWO: 95.0, FOUR: 190.0}}
    default = overlap_tables.figures(json.loads(json.dumps(overlap_result(48.9, 50.0))))
    assert default["using_stream"] is False and set(default["batch_ms"]) == {TWO, FOUR}


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("batch_ms"), "'batch_ms' is NoneType, not an object of figures"),
    (lambda r: r["batch_ms"].pop("4 streams"), "batch_ms['4 streams'] = None is not a positive time"),
    (lambda r: r["batch_ms"].pop("2 streams, using_stream"), "batch_ms['2 streams, using_stream'] = None"),
    (lambda r: r["serial_ms"].update({"2 streams": 0.0}), "serial_ms['2 streams'] = 0.0 is not a positive time"),
    (lambda r: r["batch_ms"].update({"2 streams": float("nan")}), "batch_ms['2 streams'] = nan"),
    (lambda r: r["batch_ms"].update({"2 streams": True}), "batch_ms['2 streams'] = True"),
])
def test_unreadable_figures_are_named(change, message):
    result = overlap_result(48.0, 49.0, scoped=(41.8, 43.0))
    change(result)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        overlap_tables.figures(result)
    with pytest.raises(ValueError, match="^the overlap worker of numba_pool returned unreadable figures: "):
        overlap_tables.merge({"numba_pool": [result]})


def test_ratios_pair_rounds_and_using_stream_is_compared_with_defaults_plain_batch():
    # Round 2 ran in a slow spell: both 1.5x slower; paired, numba_pool is 1.25x faster every round.
    results = overlap_tables.merge({
        "default": [overlap_result(50.0, 100.0), overlap_result(75.0, 150.0), overlap_result(50.0, 100.0)],
        "numba_pool": [overlap_result(40.0, 80.0, scoped=(25.0, 50.0)),
                       overlap_result(60.0, 120.0, scoped=(37.5, 75.0)),
                       overlap_result(40.0, 80.0, scoped=(25.0, 50.0))]})
    ratios = results["numba_pool"]["vs_default"]
    assert ratios == pytest.approx({TWO: 1.25, FOUR: 1.25, TWO_SCOPED: 2.0, FOUR_SCOPED: 2.0})
    assert results["default"]["vs_default"] == {TWO: 1.0, FOUR: 1.0}
    assert results["numba_pool"]["rounds_batch_ms"][TWO] == [40.0, 60.0, 40.0]
    assert overlap_tables.keyed_ratios(results) == {("overlap", name, "numba_pool"): r for name, r in ratios.items()}


def test_clean_figures_pass_every_check():
    assert overlap_tables.check(merged(clean_overlap_results())) == []


@pytest.mark.parametrize("slower", POOLS)
def test_numba_pool_more_than_5_percent_slower_than_default_is_flagged_in_each_mode_and_stream_count(slower):
    fakes = clean_overlap_results()
    fakes[slower] = overlap_result(82.8, 84.5, scoped=(41.8, 43.0))  # the 1.69x
    flags = overlap_tables.check(merged(fakes))
    assert [(f.table, f.figure, f.label) for f in flags] == [("overlap", TWO, slower), ("overlap", FOUR, slower)]
    assert str(flags[0]) == ("CHECK FAILED [overlap] 2 streams, " + slower + ": 1.69x default's time, the target is "
                             "at most 1.05x default's time: target missed")


@pytest.mark.parametrize("two, flagged", [(48.9 * 1.05, False), (48.9 * 1.051, True), (48.9 * 0.5, False)])
def test_the_limit_is_1_05_times_defaults_time(two, flagged):
    fakes = clean_overlap_results()
    fakes["numba_pool"] = overlap_result(two, 50.0, scoped=(41.8, 43.0))
    flags = overlap_tables.check(merged(fakes))
    assert [(f.figure, f.label) for f in flags] == ([(TWO, "numba_pool")] if flagged else [])


def test_using_stream_not_faster_than_default_is_flagged():
    fakes = clean_overlap_results()
    fakes["numba_pool arena"] = overlap_result(49.5, 52.0, scoped=(48.9, 49.0))  # as fast as default at 2 streams
    flags = overlap_tables.check(merged(fakes))
    assert [(f.figure, f.label) for f in flags] == [(TWO_SCOPED, "numba_pool arena")]
    assert "1.00x faster than default, the target is faster than default: target missed" in str(flags[0])


def test_without_default_the_targets_cannot_be_shown_met():
    fakes = clean_overlap_results()
    del fakes["default"]
    flags = overlap_tables.check(merged(fakes))
    assert len(flags) == 8 and all("no ratio to default" in f.message for f in flags)


def test_rounds_that_disagree_are_flagged():
    slow = overlap_result(60.0, 50.0)
    results = overlap_tables.merge({label: [r, r, slow if label == "default" else r]
                                    for label, r in clean_overlap_results().items()})
    flags = [f for f in overlap_tables.check(results) if "rounds" in f.message]
    assert [(f.figure, f.label) for f in flags] == [(TWO, "default")]
    assert "rounds disagree by 23 %" in str(flags[0])


def test_target_in_words():
    assert overlap_tables.TARGETS[0].wanted == "at most 1.05x default's time"
    assert overlap_tables.TARGETS[-1].wanted == "faster than default"
    assert checks.Target("t", "f", 2.0).wanted == "at least 2x faster than default"


# -- the table, the part, the command ------------------------------------------------------------

def test_the_table_shows_ms_ratios_and_the_overlap_and_marks_a_missed_target():
    fakes = clean_overlap_results()
    fakes["numba_pool"] = overlap_result(82.8, 84.5, scoped=(41.8, 43.0))
    results = merged(fakes)
    table = overlap_tables.render(results, overlap_tables.check(results))
    header, _, default, pool, arena, pool_scoped, arena_scoped, serial = table.splitlines()
    assert "2 streams: ms per batch (x faster than default)" in header and "4 streams: overlap" in header
    assert [c.strip() for c in default.split("|")[1:-1]] == ["default", "48.90 (1.00x)", "1.94", "50.00 (1.00x)",
                                                             "3.80"]
    assert "82.80 (0.59x) !" in pool and "| 1.15 " in pool and "84.50 (0.59x) !" in pool
    assert "!" not in arena and "!" not in pool_scoped
    assert pool_scoped.startswith("| numba_pool, each allocation in using_stream(s) ")
    assert "41.80 (1.17x)" in pool_scoped and "| 2.27 " in pool_scoped
    assert arena_scoped.startswith("| numba_pool arena, each allocation in using_stream(s) ")
    assert [c.strip() for c in serial.split("|")[1:-1]] == [overlap_tables.SERIAL_ROW, "95.00", "1.00", "190.0",
                                                            "1.00"]


def test_the_kernels_alone_are_the_median_over_every_worker_and_round():
    fakes = clean_overlap_results()
    fakes["numba_pool"] = overlap_result(48.0, 49.0, scoped=(41.8, 43.0), serial=(99.0, 200.0))
    fakes["numba_pool arena"] = overlap_result(49.5, 52.0, scoped=(42.0, 44.0), serial=(101.0, 210.0))
    assert overlap_tables.serial_ms(merged(fakes)) == {TWO: 99.0, FOUR: 200.0}


def fake_workers(monkeypatch, figures_of=None):
    """``end_to_end.measure`` answering overlap figures (``figures_of(label, call)``, else the
    clean ones); returns the managers measured, in order."""
    measured = []

    def measure(manager, core=None, warm_up=False):
        assert manager.module == overlap_tables.MODULE and not warm_up
        measured.append(manager.label)
        if figures_of:
            return figures_of(manager.label, measured.count(manager.label))
        return clean_overlap_results()[manager.label]

    monkeypatch.setattr(end_to_end, "measure", measure)
    return measured


def test_the_part_runs_rounds_of_every_manager_prints_its_table_and_fills_the_report(monkeypatch, capsys):
    measured = fake_workers(monkeypatch)
    report = {}
    assert bench_report.overlap_part(report, SETTING, no_arena=False, rounds=2, runs=1, turns=False) == []
    out = capsys.readouterr().out
    assert measured == ["default", *POOLS] * 2
    (heading,) = [line for line in out.splitlines() if line.startswith("device: ")]
    assert "stream overlap (CPU core 0, collector off)" in heading and "median over 2 rounds" in heading
    assert "at most 1.05x default's time" in heading and "run by run" not in out
    assert set(report["overlap"]) == {"default", *POOLS} and "overlap_runs" not in report
    assert report["overlap"]["numba_pool"]["rounds_batch_ms"][TWO] == [48.0, 48.0]
    json.dumps(report)  # the JSON report can keep it


def test_two_runs_show_their_ratios_side_by_side_and_flag_ratios_that_move(monkeypatch, capsys):
    def figures_of(label, call):
        r = clean_overlap_results()[label]
        if label == "numba_pool arena" and call > 2:  # run 2 (rounds 3, 4): 20 % slower at 2 streams
            r = overlap_result(49.5 * 1.2, 52.0, scoped=(42.0, 44.0))
        return r

    fake_workers(monkeypatch, figures_of)
    report = {}
    flags = bench_report.overlap_part(report, SETTING, no_arena=False, rounds=2, runs=2, turns=False)
    out = capsys.readouterr().out
    assert "run 1/2, stream overlap" in out and "run 2/2, stream overlap" in out
    assert "stream overlap, x faster than default, run by run" in out
    assert [(f.table, f.figure, f.label) for f in flags] == [("overlap", TWO, "numba_pool arena"),
                                                             ("overlap runs", TWO, "numba_pool arena")]
    assert len(report["overlap_runs"]) == 2 and report["overlap"] == report["overlap_runs"][0]


def test_a_worker_that_fails_or_returns_unreadable_figures_stops_the_part_naming_it(monkeypatch):
    def failing(manager, core=None, warm_up=False):
        raise RuntimeError(f"benchmark of {manager.label} failed: exit 1:\nbench: the overlap kernel's output is wrong")

    monkeypatch.setattr(end_to_end, "measure", failing)
    with pytest.raises(bench_report.BenchError, match="^benchmark of default failed: exit 1"):
        bench_report.overlap_part({}, SETTING, no_arena=False, rounds=1, runs=1, turns=False)
    fake_workers(monkeypatch, lambda label, call: {"batch_ms": {}, "serial_ms": {}})
    with pytest.raises(bench_report.BenchError, match="^the overlap worker of default returned unreadable figures"):
        bench_report.overlap_part({}, SETTING, no_arena=False, rounds=1, runs=1, turns=False)


def test_in_turns_each_round_starts_the_overlap_worker_of_every_manager(monkeypatch, capsys):
    started = []

    def run_in_turns(commands, core_=None):
        started.append({label: (argv[1:], env["NUMBA_POOL_ARENA"] if "NUMBA_POOL_ARENA" in env else None,
                                env["NUMBA_CUDA_MEMORY_MANAGER"])
                        for label, (argv, env, cwd) in commands.items()})
        return {label: turns.Outcome(0, json.dumps({**clean_overlap_results()[label], "frontend": core.FRONTEND.name}),
                                     "", 0.1, True) for label in commands}

    monkeypatch.setattr(turns, "run_in_turns", run_in_turns)
    monkeypatch.delenv("NUMBA_POOL_ARENA", raising=False)
    assert bench_report.overlap_part({}, SETTING, no_arena=False, rounds=2, runs=1, turns=True) == []
    module = ["-m", "numba_pool_tools.bench.overlap"]
    assert started == [{"default": (module, None, "default"), "numba_pool": (module, "0", "numba_pool"),
                        "numba_pool arena": (module, "1", "numba_pool")}] * 2


def test_launching_a_manager_runs_its_module(monkeypatch):
    ran = []
    said = {"frontend": core.FRONTEND.name}
    monkeypatch.setattr(launch, "run_module", lambda module, *rest: ran.append(module) or said)
    end_to_end.measure(overlap_tables.managers()[0])
    end_to_end.measure(end_to_end.DEFAULT)
    assert ran == ["numba_pool_tools.bench.overlap", "numba_pool_tools.bench"]


@pytest.fixture
def asked(monkeypatch):
    """``numba-pool-tools bench`` on a fake GPU, ``report.run`` replaced: the options it was given."""
    from numba_pool_tools.cli import bench

    options = {}

    def run(setting, **given):
        options.update(given)
        return {}, []

    monkeypatch.setattr(bench, "require_gpu", lambda: None)
    monkeypatch.setattr(core.cuda, "get_current_device", lambda: SimpleNamespace(name=b"Fake GPU"))
    monkeypatch.setattr(bench_report, "run", run)
    return options


def test_the_command_runs_the_part_with_rounds_runs_and_json(asked, tmp_path):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["bench", "--part", "overlap", "--rounds", "3", "--repeat-run", "2",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert (asked["part"], asked["rounds"], asked["runs"], asked["turns"]) == ("overlap", 3, 2, True)
    assert json.loads(out.read_text()) == {}


def test_the_default_part_runs_every_part_the_overlap_too(monkeypatch, capsys):
    ran = []
    for name in ("allocator_part", "end_to_end_part", "graphs_part", "overlap_part"):
        monkeypatch.setattr(bench_report, name, lambda *args, _name=name, **options: ran.append(_name) or [])
    bench_report.run(SETTING, part="all", baseline=None, anchors=False, plain_pool=False, no_arena=False, rounds=1,
                     runs=1, warm_up=0, turns=False, host_rows=False)
    assert ran == ["allocator_part", "end_to_end_part", "graphs_part", "overlap_part"]
    ran.clear()
    bench_report.run(SETTING, part="overlap", baseline=None, anchors=False, plain_pool=False, no_arena=False,
                     rounds=1, runs=1, warm_up=0, turns=False, host_rows=False)
    assert ran == ["overlap_part"]


def test_the_help_names_the_part():
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert "overlap" in result.output and "[all|allocator|end-to-end|graphs|overlap]" in result.output
