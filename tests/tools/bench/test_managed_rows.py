"""The bench's managed rows (``cuda.managed_array`` allocate+free, the managed pipeline) without a
GPU: the worker's arguments, where managed memory comes from, the room it needs, which worker runs
what, reading the figures back, ratios, the self-checks (issue 21's targets among them), the
tables, the JSON report, and the command's switches.  The worker's managed code runs under
numba-cuda's CUDA simulator in tests/bench/test_host_rows.py (clean, and with a planted kernel)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from end_to_end_fakes import SETTING, clean_results, result
from helpers import PACKAGE_PARENT
from numba_pool_tools.bench import anchors, checks, core, end_to_end, worker
from numba_pool_tools.bench import host_tables as t
from numba_pool_tools.bench import host_worker as h
from numba_pool_tools.bench import report as bench_report
from numba_pool_tools.cli import main
from numba_pool.cuda import frontend as frontends

S4K, S1M, S64M = (str(s) for s in h.SIZES)
ALL_PARTS = "pinned,pipeline,managed,managed-pipeline"


# -- the worker's side, no GPU ----------------------------------------------------------------------

@pytest.mark.parametrize("argv, parsed", [
    (["--host", "managed-pipeline,managed"], (("managed", "managed-pipeline"), True)),
    (["--host", "managed", "--no-device"], (("managed",), False)),
    (["--no-device"], ((), False)),
    (["--host", f"{ALL_PARTS}"], (("pinned", "pipeline", "managed", "managed-pipeline"), True)),
])
def test_managed_parts_and_no_device_come_from_the_arguments(argv, parsed):
    assert h.parse_arguments(argv) == parsed


def test_each_part_has_its_own_phase_after_the_device_arrays():
    assert [h.PHASES[p] for p in h.PARTS] == [1, 2, 3, 4]  # phase 0 is cuda.device_array
    assert set(h.CELLS) == set(h.PARTS)
    assert h.MANAGED_MEMORY.fields == (h.MANAGED, h.MANAGED_PIPELINE)
    assert h.UNITS[h.MANAGED] == 1e6 and h.UNITS[h.MANAGED_PIPELINE] == 1e3  # µs per pair, ms per batch


class _OwnManaged:
    def memallocmanaged(self, size, attach_global=True):
        raise NotImplementedError


def test_where_managed_memory_comes_from_is_said_in_words(frontend_name):
    from numba_pool.plugin.manager import manager_class

    def source(manager):
        return h.memory_source(manager, h.MANAGED_MEMORY)

    frontend = frontends.load(frontend_name)
    base = frontend.HostOnlyCUDAMemoryManager
    numba = type("_Numba", (base,), {})
    numba.__abstractmethods__ = frozenset()
    pool = manager_class(frontend)
    assert source(None) == "no memory manager (the CUDA simulator)"
    assert source(SimpleNamespace(managed=object())) == "numba_pool managed cache"
    assert source(SimpleNamespace(host=object(), managed=None)) == "types.SimpleNamespace.memallocmanaged"
    assert source(_OwnManaged()) == f"{__name__}._OwnManaged.memallocmanaged"
    assert source(numba.__new__(numba)) == "cuMemAllocManaged per array"  # Numba's own, either frontend
    assert source(pool.__new__(pool)) == "cuMemAllocManaged per array"  # numba_pool's, its cache off


def test_the_managed_parts_refuse_to_run_without_room_on_the_device():
    needed = h.room_needed(h.SIZES)
    assert needed == 12 * (64 << 20)  # the array in use and up to 11 that Numba's own manager holds back
    h.check_room(h.SIZES, needed)  # exactly enough
    h.check_room(h.SIZES, None)  # not known: the simulator
    with pytest.raises(SystemExit) as refused:
        h.check_room(h.SIZES, needed - 1)
    assert str(refused.value) == (f"bench: the managed rows need {needed} bytes (768 MiB: 12 arrays of 64 MiB) free on "
                                  f"the device, it has {needed - 1} bytes (767 MiB): refusing to time "
                                  "(--no-managed-rows leaves them out)")


def test_a_worker_without_the_device_part_checks_and_times_only_its_host_parts(monkeypatch):
    calls = []
    monkeypatch.setattr(worker, "check_kernels", lambda: calls.append("check_kernels"))
    monkeypatch.setattr(worker, "_time_device_arrays", lambda *a: calls.append("device") or {"seed_loop_ms": 1.0})
    monkeypatch.setattr(h, "check", lambda parts: calls.append(("check", parts)))
    monkeypatch.setattr(h, "measure", lambda parts, repeats: calls.append(("measure", parts)) or {"repeats": repeats})
    assert worker.run_worker(("managed",), device=False) == {"frontend": core.FRONTEND.name,
                                                             "host": {"repeats": h.REPEATS}}
    assert calls == [("check", ("managed",)), ("measure", ("managed",))]
    calls.clear()
    assert "seed_loop_ms" in worker.run_worker(("managed",))  # the default: the device part too
    assert calls[0] == "check_kernels" and "device" in calls


# -- which worker runs what ----------------------------------------------------------------------------

def _everyone():
    return [end_to_end.DEFAULT, end_to_end.NUMBA_POOL, end_to_end.ARENA, end_to_end.FLOOR, end_to_end.BARE_FLOOR,
            end_to_end.CUPY, end_to_end.RMM, *end_to_end.baselines("/elsewhere")]


def test_plan_gives_default_and_numba_pool_the_managed_parts_and_notes_the_others():
    planned, notes = t.plan(_everyone(), known=lambda cwd: h.PARTS)
    by_label = {m.label: m for m in planned}
    assert by_label["default"].args == ("--host", ALL_PARTS) and "NUMBA_POOL_MANAGED" not in by_label["default"].env
    for label in ("numba_pool", "numba_pool arena", "numba_pool (baseline)", "numba_pool arena (baseline)"):
        assert by_label[label].args == ("--host", ALL_PARTS)
        assert by_label[label].env["NUMBA_POOL_MANAGED"] == "1" and by_label[label].env["NUMBA_POOL_HOST"] == "1"
    assert by_label["cupy (pool)"].args == by_label["rmm (pool)"].args == ("--host", "pipeline")
    assert by_label["no-op floor"] is end_to_end.FLOOR
    assert t.MANAGED_NOTE.format(labels="no-op floor, Numba alone, cupy (pool), rmm (pool)") in notes
    assert "cuMemAllocManaged per array" in notes[-1]


def test_managed_rows_alone_leave_the_pinned_cache_as_it_is():
    planned, notes = t.plan(_everyone()[:4], (h.MANAGED_MEMORY,), known=lambda cwd: h.PARTS)
    by_label = {m.label: m for m in planned}
    assert by_label["default"].args == ("--host", "managed,managed-pipeline")
    assert by_label["numba_pool"].env["NUMBA_POOL_MANAGED"] == "1" and "NUMBA_POOL_HOST" not in by_label["numba_pool"].env
    assert by_label["no-op floor"] is end_to_end.FLOOR  # still timing its device arrays
    assert notes == [t.MANAGED_NOTE.format(labels="no-op floor")]


def test_without_the_device_rows_the_idle_workers_are_left_out_and_the_others_told():
    planned, notes = t.plan(_everyone(), (h.MANAGED_MEMORY,), device=False, known=lambda cwd: h.PARTS)
    assert [m.label for m in planned] == ["default", "numba_pool", "numba_pool arena", "numba_pool (baseline)",
                                          "numba_pool arena (baseline)"]
    assert all(m.args == ("--host", "managed,managed-pipeline", "--no-device") for m in planned)
    assert notes[-1] == t.IDLE_NOTE.format(labels="no-op floor, Numba alone, cupy (pool), rmm (pool)")


def test_a_baseline_from_before_the_managed_rows_gets_the_parts_it_knows():
    asked = []

    def known(cwd):
        asked.append(cwd)
        return h.PINNED_PARTS if cwd == "/elsewhere" else h.PARTS

    planned, notes = t.plan(_everyone(), device=False, known=known)
    by_label = {m.label: m for m in planned}
    assert by_label["numba_pool (baseline)"].args == ("--host", "pinned,pipeline")  # no --no-device: it would refuse
    assert "NUMBA_POOL_MANAGED" not in by_label["numba_pool (baseline)"].env
    assert by_label["numba_pool"].args == ("--host", ALL_PARTS, "--no-device")
    assert t.UNKNOWN_NOTE.format(label="numba_pool (baseline)", parts="managed, managed-pipeline") in notes
    assert asked == [None, "/elsewhere"]  # once a folder


def _package(folder, host_worker_source: str | None):
    (folder / "numba_pool" / "bench").mkdir(parents=True)
    (folder / "numba_pool" / "__init__.py").write_text("")
    (folder / "numba_pool" / "bench" / "__init__.py").write_text("")
    if host_worker_source is not None:
        (folder / "numba_pool" / "bench" / "host_worker.py").write_text(host_worker_source)
    return str(folder)


def test_known_parts_asks_the_numba_pool_a_worker_would_import(tmp_path):
    assert t.known_parts(None) == h.PARTS
    assert t.known_parts(PACKAGE_PARENT) == h.PARTS  # this numba_pool, asked in a process of its own
    older = _package(tmp_path / "older", 'PARTS = ("pinned", "pipeline")\n')
    assert t.known_parts(older) == ("pinned", "pipeline")
    ancient = _package(tmp_path / "ancient", None)  # no host_worker: the pinned parts, as ever
    assert t.known_parts(ancient) == h.PINNED_PARTS
    assert t.known_parts(str(tmp_path / "gone")) == h.PINNED_PARTS


# -- the parent's side: figures, ratios, checks, tables ------------------------------------------------

def host(managed=None, pipeline=None, cache=False, counts=1000, repeats=9, source=None):
    """A worker's ``host`` object with managed figures: each a list of three (4 KiB, 1 MiB, 64 MiB)."""
    out = {"repeats": repeats, "managed_cache": cache, "counts": {}, "host_cache": False,
           "pinned_from": "cuMemHostAlloc per array",
           "managed_from": source or ("numba_pool managed cache" if cache else "cuMemAllocManaged per array")}
    for field, values in ((h.MANAGED, managed), (h.MANAGED_PIPELINE, pipeline)):
        if values is not None:
            out[field] = dict(zip((S4K, S1M, S64M), values))
            out["counts"][field] = dict.fromkeys((S4K, S1M, S64M), counts)
    return out


DEFAULT = host([25.0, 25.5, 26.0], [0.08, 0.6, 40.0])
POOL = host([4.0, 4.2, 4.5], [0.05, 0.4, 30.0], cache=True)  # 6.25x, 6.07x, 5.78x; 1.6x, 1.5x, 1.33x


def merged(rows: dict) -> dict:
    return {label: t.median_over_rounds([t.host_figures({"host": r}) for r in rounds])
            for label, rounds in rows.items()}


def test_managed_figures_read_back_and_merge_over_rounds():
    figures = t.host_figures({"host": POOL})
    assert figures[h.MANAGED] == {S4K: 4.0, S1M: 4.2, S64M: 4.5} and figures["counts"][h.MANAGED_PIPELINE][S4K] == 1000
    assert figures["managed_cache"] is True and figures["managed_from"] == "numba_pool managed cache"
    assert t.host_figures({"host": {"repeats": 9, h.MANAGED: {S4K: 4.0}}})["managed_from"] == "-"  # did not say
    with pytest.raises(ValueError, match=r"managed_pipeline_ms\[4096\] = 0 is not a positive time"):
        t.host_figures({"host": {**POOL, h.MANAGED_PIPELINE: {S4K: 0}}})
    m = merged({"numba_pool": [POOL, host([4.4, 4.2, 4.5], [0.05, 0.4, 30.0], cache=False), POOL]})["numba_pool"]
    assert m[h.MANAGED][S4K] == 4.0 and m[f"rounds_{h.MANAGED}"][S4K] == [4.0, 4.4, 4.0]
    assert m["managed_cache"] is False and m["managed_from"] == "numba_pool managed cache"


def test_managed_ratios_to_default_and_their_keys():
    ratios = t.ratios_to_default(merged({"default": [DEFAULT], "numba_pool": [POOL]}))
    assert ratios["numba_pool"][h.MANAGED][S64M] == pytest.approx(26.0 / 4.5)
    assert ratios["numba_pool"][h.MANAGED_PIPELINE][S4K] == pytest.approx(0.08 / 0.05)
    keyed = t.keyed_ratios(ratios)
    assert keyed[("managed alloc+free", "managed_array 64 MiB", "numba_pool")] == pytest.approx(26.0 / 4.5)
    assert keyed[("managed pipeline", "managed batch 4 KiB", "numba_pool")] == pytest.approx(1.6)
    report = {"host_results": {label: {"vs_default": r} for label, r in ratios.items()}}
    assert ("managed pipeline", "managed batch 1 MiB", "numba_pool") in bench_report.ratios_of(report)
    assert not any(label == "default" for _, _, label in bench_report.ratios_of(report))


def test_the_issues_targets_are_the_checks():
    assert [(g.table, g.figure, g.times, g.strictly) for g in t.MANAGED_TARGETS] == [
        ("managed alloc+free", "managed_array 4 KiB", 2.0, False),
        ("managed alloc+free", "managed_array 64 MiB", 5.0, False),
        ("managed pipeline", "managed batch 4 KiB", 1.0, True), ("managed pipeline", "managed batch 1 MiB", 1.0, True),
        ("managed pipeline", "managed batch 64 MiB", 1.0, True)]
    assert t.targets_text(t.MANAGED_TABLE) == ("targets for numba_pool, numba_pool arena: managed_array 4 KiB at least "
                                               "2x faster than default, managed_array 64 MiB at least 5x faster than "
                                               "default")
    assert t.targets_text(t.HOST_TABLE) == ""


@pytest.mark.parametrize("ratio, met", [(2.0, True), (2.01, True), (1.99, False)])
def test_an_at_least_target_holds_at_its_bound(ratio, met):
    assert checks.Target("t", "f", 2.0).met(ratio) is met


@pytest.mark.parametrize("ratio, met", [(1.0, False), (1.001, True), (0.9, False)])
def test_faster_than_default_means_strictly_faster(ratio, met):
    target = checks.Target("t", "f", 1.0, strictly=True)
    assert target.met(ratio) is met and target.wanted == "faster than default"


def test_figures_that_meet_the_targets_raise_no_flag():
    results = merged({"default": [DEFAULT], "numba_pool": [POOL], "numba_pool arena": [POOL]})
    assert t.target_flags(results) == []


def test_a_planted_slow_managed_pair_fails_its_target_and_is_marked():
    slow = host([16.0, 4.2, 5.3], [0.05, 0.4, 30.0], cache=True)  # 4 KiB: 1.56x (< 2x); 64 MiB: 4.91x (< 5x)
    results = merged({"default": [DEFAULT], "numba_pool": [slow], "numba_pool arena": [POOL]})
    flags = t.target_flags(results)
    assert [(f.table, f.figure, f.label) for f in flags] == [("managed alloc+free", "managed_array 4 KiB", "numba_pool"),
                                                             ("managed alloc+free", "managed_array 64 MiB", "numba_pool")]
    assert str(flags[0]) == ("CHECK FAILED [managed alloc+free] managed_array 4 KiB, numba_pool: 1.56x faster than "
                             "default, the target is at least 2x faster than default: target missed")
    table = t.render(t.MANAGED_TABLE, results, flags)
    assert cells(table, "numba_pool")[1:] == ["numba_pool managed cache", "16.00 (1.56x) !", "4.200 (6.07x)",
                                              "5.300 (4.91x) !"]
    assert not any(cell.endswith("!") for cell in cells(table, "numba_pool arena"))


def test_a_managed_pipeline_no_faster_than_default_fails_at_that_size_only():
    even = host([4.0, 4.2, 4.5], [0.05, 0.6, 30.0], cache=True)  # 1 MiB: as fast as default
    flags = t.target_flags(merged({"default": [DEFAULT], "numba_pool arena": [even]}))
    assert [(f.table, f.figure, f.label) for f in flags] == [("managed pipeline", "managed batch 1 MiB",
                                                              "numba_pool arena")]
    assert "1.00x faster than default, the target is faster than default" in flags[0].message


def test_targets_without_a_default_row_cannot_be_shown_met():
    flags = t.target_flags(merged({"numba_pool": [POOL]}))
    assert len(flags) == len(t.MANAGED_TARGETS) and all("cannot be checked" in f.message for f in flags)
    assert t.target_flags(merged({"default": [DEFAULT], "numba_pool (baseline)": [DEFAULT]})) == []  # not held to them


def test_a_row_run_with_the_managed_cache_that_did_not_use_it_is_flagged():
    results = merged({"numba_pool": [POOL, {**POOL, "managed_cache": False}], "default": [DEFAULT]})
    flags = t.cache_flags(results, {"numba_pool"}, h.MANAGED_MEMORY)
    assert [(f.table, f.figure, f.label) for f in flags] == [("managed alloc+free", "every size", "numba_pool"),
                                                             ("managed pipeline", "every size", "numba_pool")]
    assert ("its managed memory did not come from numba_pool's managed cache although NUMBA_POOL_MANAGED=1"
            in flags[0].message)
    assert t.cache_flags(results, {"numba_pool"}) == []  # no pinned figures: no pinned flag


def cells(table: str, label: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {label} "))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_managed_tables_columns_rows_and_ratios():
    results = merged({"default": [DEFAULT], "numba_pool": [POOL]})
    table = t.render(t.MANAGED_TABLE, results)
    header = table.splitlines()[0]
    assert "managed memory from" in header and "managed_array 4 KiB us (x faster)" in header
    assert cells(table, "default")[1:] == ["cuMemAllocManaged per array", "25.00 (1.00x)", "25.50 (1.00x)",
                                           "26.00 (1.00x)"]
    pipeline = t.render(t.MANAGED_PIPELINE_TABLE, results)
    assert "managed batch 64 MiB ms (x faster)" in pipeline.splitlines()[0]
    assert cells(pipeline, "numba_pool")[1:] == ["numba_pool managed cache", "0.05000 (1.60x)", "0.4000 (1.50x)",
                                                 "30.00 (1.33x)"]
    assert t.present(t.MANAGED_TABLE, results) and not t.present(t.HOST_TABLE, results)


# -- the end-to-end part with the workers faked -----------------------------------------------------------

FIELDS_OF = {"pinned": (h.PINNED, h.MAPPED), "pipeline": (h.PIPELINE,), "managed": (h.MANAGED,),
             "managed-pipeline": (h.MANAGED_PIPELINE,)}


def fake_worker(rows):
    """An end_to_end.measure stand-in: the device figures unless ``--no-device``, the host figures
    of ``rows`` (``{label: host object}``) for the parts asked; records the managers it ran."""
    seen = []

    def measure(manager, cpu=None, warm_up=False):
        seen.append(manager)
        r = {"frontend": core.FRONTEND.name}
        if "--no-device" not in manager.args:
            r.update(clean_results().get(manager.label, result(4.0, 11.0, 11.0, 11.0, 11.0)), manager="m", core=cpu)
        if "--host" in manager.args:
            parts = manager.args[manager.args.index("--host") + 1].split(",")
            figures = json.loads(json.dumps(rows[manager.label]))
            fields = {f for p in parts for f in FIELDS_OF[p]}
            r["host"] = {k: v for k, v in figures.items() if k not in h.FIELDS or k in fields}
        return r

    return measure, seen


def test_end_to_end_prints_the_managed_tables_with_their_targets(monkeypatch, capsys):
    slow = host([16.0, 4.2, 4.5], [0.05, 0.4, 30.0], cache=True)
    measure, seen = fake_worker({"default": DEFAULT, "numba_pool": slow, "numba_pool arena": POOL})
    monkeypatch.setattr(end_to_end, "measure", measure)
    monkeypatch.setattr(anchors, "installed", lambda label: False)
    report = {}
    flags = bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=2, baseline=None,
                                         host_rows=False)
    out = capsys.readouterr().out
    assert [(f.table, f.figure, f.label) for f in flags] == [("managed alloc+free", "managed_array 4 KiB", "numba_pool")]
    assert "numba_pool rows with NUMBA_POOL_MANAGED=1, which these figures do not use" in out
    assert "managed memory end to end (CPU core 0, collector off; numba_pool rows with NUMBA_POOL_MANAGED=1)" in out
    assert "targets for numba_pool, numba_pool arena: managed_array 4 KiB at least 2x faster than default" in out
    assert "managed pipeline end to end" in out and "pinned host memory" not in out
    assert "| numba_pool       | numba_pool managed cache    | 16.00 (1.56x) !" in out
    assert "CHECK FAILED [managed alloc+free] managed_array 4 KiB, numba_pool: 1.56x faster than default" in out
    assert f"note: {t.MANAGED_NOTE.format(labels='no-op floor, Numba alone')}" in out
    assert {m.label for m in seen if "--host" not in m.args} == {"no-op floor", "Numba alone"}
    json.dumps(report)
    pool = report["host_results"]["numba_pool"]
    assert pool[h.MANAGED] == {S4K: 16.0, S1M: 4.2, S64M: 4.5} and pool["managed_cache"] is True
    assert pool["vs_default"][h.MANAGED][S4K] == pytest.approx(25.0 / 16.0)
    assert report["worker_env"]["numba_pool"]["NUMBA_POOL_MANAGED"] == "1"
    assert "cuda.device_array end to end" in out and "results" in report


def test_end_to_end_without_the_device_rows_runs_the_managed_workers_alone(monkeypatch, capsys):
    measure, seen = fake_worker({"default": DEFAULT, "numba_pool": POOL, "numba_pool arena": POOL})
    monkeypatch.setattr(end_to_end, "measure", measure)
    monkeypatch.setattr(anchors, "installed", lambda label: label == "cupy (pool)")
    report = {}
    flags = bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=2, baseline=None,
                                         host_rows=False, device_rows=False, warm_up=1)
    out = capsys.readouterr().out
    assert flags == []
    assert {m.label for m in seen} == {"default", "numba_pool", "numba_pool arena"}  # 3 workers x 3 rounds
    assert len(seen) == 9 and all(m.args[-1] == "--no-device" for m in seen)
    assert "cuda.device_array end to end" not in out and "results" not in report
    assert "managed memory end to end" in out and "managed pipeline end to end" in out
    assert f"note: {t.IDLE_NOTE.format(labels='no-op floor, Numba alone, cupy (pool)')}" in out
    assert set(report["host_results"]) == {"default", "numba_pool", "numba_pool arena"}
    assert set(report["worker_seconds"]) == {"default", "numba_pool", "numba_pool arena"}


def test_no_kind_of_row_is_one_error_before_any_worker(monkeypatch):
    measure, seen = fake_worker({})
    monkeypatch.setattr(end_to_end, "measure", measure)
    with pytest.raises(bench_report.BenchError, match="leave the end-to-end part nothing to time"):
        bench_report.end_to_end_part({}, SETTING, anchors=False, no_arena=False, rounds=1, baseline=None,
                                     host_rows=False, managed_rows=False, device_rows=False)
    assert seen == []


# -- the command's switches ---------------------------------------------------------------------------------

@pytest.fixture
def fake_gpu_bench(monkeypatch):
    """``numba-pool-tools bench`` on a fake GPU, ``report.run`` replaced: the options it was given."""
    from numba_pool_tools.cli import bench

    asked = {}

    def run(setting, **options):
        asked.update(options)
        return {}, []

    monkeypatch.setattr(bench, "require_gpu", lambda: None)
    monkeypatch.setattr(core.cuda, "get_current_device", lambda: SimpleNamespace(name=b"Fake GPU"))
    monkeypatch.setattr(bench_report, "run", run)
    monkeypatch.setenv(frontends.VARIABLE, core.FRONTEND.name)
    return asked


@pytest.mark.parametrize("argv, managed, device", [([], True, True), (["--no-managed-rows"], False, True),
                                                   (["--no-device-rows", "--no-host-rows"], True, False),
                                                   (["--managed-rows", "--device-rows"], True, True)])
def test_the_row_switches_reach_the_bench(fake_gpu_bench, argv, managed, device):
    result_ = CliRunner().invoke(main, ["bench", "--part", "end-to-end", *argv])
    assert result_.exit_code == 0, result_.output
    assert (fake_gpu_bench["managed_rows"], fake_gpu_bench["device_rows"]) == (managed, device)
    assert fake_gpu_bench["host_rows"] is ("--no-host-rows" not in argv)


def test_the_help_documents_the_row_switches():
    result_ = CliRunner().invoke(main, ["bench", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result_.output.split())
    assert result_.exit_code == 0
    assert "--managed-rows / --no-managed-rows" in text and "--device-rows / --no-device-rows" in text
    assert "NUMBA_POOL_MANAGED=1" in text and "at least 2x faster than default at 4 KiB and 5x at 64 MiB" in text
