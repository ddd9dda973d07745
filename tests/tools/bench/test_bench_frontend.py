"""The bench under either Numba CUDA frontend, without a GPU: every process it starts runs under
its frontend (``NUMBA_POOL_FRONTEND``), ``numba-pool-tools bench --frontend`` chooses it, the tables
and the JSON report name it, RMM's rows (numba-cuda's only) are skipped under Numba-CUDA-MLIR
with a note, and the floors and the CuPy anchor are each frontend's own plugins."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from end_to_end_fakes import MLIR_SETTING, SETTING, clean_overlap_results, clean_results, result
from helpers import FRONTENDS, MISSING_FRONTENDS, PACKAGE_PARENT, check_one_line_error
from numba_pool_tools.bench import anchors, core, end_to_end, launch, overlap_tables, turns
from numba_pool_tools.bench import report as bench_report
from numba_pool_tools.cli import main
from numba_pool.cuda import frontend as frontends

VARIABLE = frontends.VARIABLE
#: The frontend this test process's bench does not run under.
OTHER = next(name for name in frontends.NAMES if name != core.FRONTEND.name)
BOTH = pytest.mark.skipif(len(FRONTENDS) < 2, reason="; ".join(MISSING_FRONTENDS.values()))
RMM_NOTES = [f"{label}: row skipped, RMM's plugin (rmm.allocators.numba.RMMNumbaManager) is built on numba-cuda's "
             "EMM classes, not Numba-CUDA-MLIR's (--frontend numba-cuda runs it)"
             for label in ("rmm (pool)", "rmm (cuda_async)")]


def python(code: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter started where the numba_pool under test is found."""
    return subprocess.run([sys.executable, "-c", code, *args], env={**os.environ, **env}, cwd=PACKAGE_PARENT,
                          capture_output=True, text=True, timeout=300)


# -- the processes the bench starts -----------------------------------------------------------------

def test_every_process_gets_the_parents_frontend_over_an_inherited_or_given_one(monkeypatch):
    monkeypatch.setenv(VARIABLE, OTHER)  # left in the user's shell
    argv, env, _ = launch.command("numba_pool_tools.bench", ["--host", "pipeline"], {VARIABLE: OTHER, "X": "1"}, None)
    assert env[VARIABLE] == core.FRONTEND.name and env["X"] == "1"
    assert argv[1:] == ["-m", "numba_pool_tools.bench", "--host", "pipeline"]


def test_workers_in_turns_one_by_one_and_allocator_runs_all_carry_the_frontend(monkeypatch):
    ran = []

    def subprocess_run(argv, env, cwd, capture_output, text):
        ran.append((argv[2], env[VARIABLE]))
        output = {"sizes": {}, "notes": [], "core": 0} if argv[2] == bench_report.ALLOCATOR_MODULE else {}
        return subprocess.CompletedProcess(argv, 0, json.dumps({**output, "frontend": env[VARIABLE]}), "")

    def run_in_turns(commands, core_=None):
        ran.extend((argv[2], env[VARIABLE]) for argv, env, cwd in commands.values())
        return {label: turns.Outcome(0, json.dumps({"frontend": env[VARIABLE]}), "", 0.1, True)
                for label, (argv, env, cwd) in commands.items()}

    monkeypatch.setattr(launch.subprocess, "run", subprocess_run)
    monkeypatch.setattr(turns, "run_in_turns", run_in_turns)
    monkeypatch.delenv(VARIABLE, raising=False)
    end_to_end.measure(end_to_end.DEFAULT, core=0)
    measured = end_to_end.measure_round([end_to_end.NUMBA_POOL, end_to_end.FLOOR], core=0)
    bench_report._allocator_run([], 0, 0, 1)
    name = core.FRONTEND.name
    assert ran == [("numba_pool_tools.bench", name)] * 3 + [(bench_report.ALLOCATOR_MODULE, name)]
    assert measured == {"numba_pool": ({"frontend": name}, 0.1), "no-op floor": ({"frontend": name}, 0.1)}


PROBE = ("import json, sys\nsys.path.insert(0, {parent!r})\nimport {other}\n"  # the other frontend, imported first
         "from numba_pool_tools.bench import core\n"
         "print(json.dumps([core.FRONTEND.name, core.HostOnlyCUDAMemoryManager.__module__]))\n")


@BOTH
def test_a_worker_runs_under_the_parents_frontend_though_it_imported_the_other_first(tmp_path, monkeypatch):
    (tmp_path / "frontend_probe.py").write_text(PROBE.format(parent=PACKAGE_PARENT, other=frontends.PACKAGES[OTHER]))
    monkeypatch.delenv(VARIABLE, raising=False)
    name, base = launch.run_module("frontend_probe", [], {}, str(tmp_path))
    assert name == core.FRONTEND.name and frontends.name_of_module(base) == core.FRONTEND.name
    # Without the variable the worker takes the frontend it imported: the variable is what holds it.
    alone = subprocess.run([sys.executable, "-m", "frontend_probe"], cwd=tmp_path, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != VARIABLE}, timeout=300)
    assert json.loads(alone.stdout)[0] == OTHER, alone.stderr[-2000:]


def test_a_worker_that_ran_under_another_frontend_is_a_failure_naming_both(monkeypatch, capsys):
    said = {"frontend": OTHER, "seed_loop_ms": 1.0}
    monkeypatch.setattr(launch, "run_module", lambda *command: said)
    with pytest.raises(RuntimeError, match=f"^benchmark of default failed: it ran under the {OTHER} frontend, "
                                           f"not {core.FRONTEND.name} as asked"):
        end_to_end.measure(end_to_end.DEFAULT)
    with pytest.raises(bench_report.BenchError, match=f"it ran under the {OTHER} frontend"):
        bench_report._allocator_run([], 0, 0, 1)



def test_a_worker_that_does_not_say_ran_under_numba_cuda_the_only_frontend_before(monkeypatch):
    said = {"seed_loop_ms": 1.0}  # a numba_pool from before the frontends (a --baseline) does not say
    monkeypatch.setattr(launch, "run_module", lambda *command: said)
    monkeypatch.setattr(launch, "FRONTEND", SimpleNamespace(name="numba-cuda"))
    assert end_to_end.measure(end_to_end.DEFAULT) == said
    monkeypatch.setattr(launch, "FRONTEND", SimpleNamespace(name="mlir"))
    with pytest.raises(RuntimeError, match="^benchmark of default failed: it ran under the numba-cuda frontend, not "
                                           "mlir as asked .*: a numba_pool from before the frontends"):
        end_to_end.measure(end_to_end.DEFAULT)


@pytest.mark.parametrize("frontend_variable", ["numba-cuda", "mlir"])
def test_each_frontend_takes_the_floor_and_cupy_plugins_from_its_own_classes(frontend_variable):
    if frontend_variable not in FRONTENDS:
        pytest.skip(MISSING_FRONTENDS[frontend_variable])
    # What a context's creation does with NUMBA_CUDA_MEMORY_MANAGER (_ensure_memory_manager).
    code = ("import json, sys\nfrom numba_pool.cuda.frontend import for_tools\nfe = for_tools()\n"
            "fe.driver._ensure_memory_manager()\nm = fe.driver._memory_manager\n"
            "print(json.dumps([m.__qualname__, issubclass(m, fe.HostOnlyCUDAMemoryManager), 'numba' in sys.modules]))")
    for module, plugin in (("numba_pool_tools.bench.noop", "NoopManager"), ("numba_pool_tools.bench.anchors", "CupyNumbaManager")):
        proc = python(code, {VARIABLE: frontend_variable, "NUMBA_CUDA_MEMORY_MANAGER": module})
        assert proc.returncode == 0, proc.stderr[-3000:]
        # Numba-CUDA-MLIR's worker imports no numba (its floor once imported numba.cuda to ask about the simulator).
        assert json.loads(proc.stdout) == [plugin, True, frontend_variable == "numba-cuda"]


@pytest.mark.skipif("numba-cuda" not in FRONTENDS, reason=MISSING_FRONTENDS.get("numba-cuda", ""))
def test_under_the_simulator_the_floor_says_once_that_numba_ignores_it():
    code = ("import json, warnings\nwith warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n    from numba_pool_tools.bench import core, noop\n"
            "try:\n    noop.NoopManager(context=None)\n    refused = ''\nexcept RuntimeError as err:\n"
            "    refused = str(err)\n"
            "print(json.dumps([[str(w.message) for w in caught if w.category.__name__ == 'SimulatorWarning'], "
            "core.SIMULATOR, refused]))")
    proc = python(code, {VARIABLE: "numba-cuda", "NUMBA_ENABLE_CUDASIM": "1",
                         "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool_tools.bench.noop"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes, simulator, refused = json.loads(proc.stdout)
    assert notes == ["NUMBA_CUDA_MEMORY_MANAGER=numba_pool_tools.bench.noop is ignored: the CUDA simulator is on "
                     "(NUMBA_ENABLE_CUDASIM=1): it keeps device arrays in host memory and has no memory manager for "
                     "numba_pool to replace"]
    assert simulator is True and refused.startswith("numba_pool: NoopManager cannot be used: the CUDA simulator is on")


# -- the report names the frontend ------------------------------------------------------------------

def fake_worker(measured: list):
    def measure(manager, core=None, warm_up=False):
        measured.append(manager.label)
        if manager.module == overlap_tables.MODULE:
            return clean_overlap_results()[manager.label]
        return {**clean_results().get(manager.label, result(4.0, 11.0, 11.0, 11.0, 11.0)), "manager": "m"}

    return measure


def test_frontend_label_is_the_title_and_the_installed_version(monkeypatch):
    for name, distribution, title in (("numba-cuda", "numba-cuda", "numba-cuda"),
                                      ("mlir", "numba-cuda-mlir", "Numba-CUDA-MLIR")):
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            version = "(version unknown)"
        assert core.frontend_label(name) == f"{title} {version}"

    def missing(distribution):
        raise importlib.metadata.PackageNotFoundError(distribution)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert core.frontend_label("mlir") == "Numba-CUDA-MLIR (version unknown)"


def test_every_table_heading_and_the_json_report_name_the_frontend(monkeypatch, capsys):
    monkeypatch.setattr(end_to_end, "measure", fake_worker([]))
    monkeypatch.setattr(anchors, "installed", lambda label: False)
    monkeypatch.setattr(launch, "run_module", lambda *command: {"sizes": {}, "notes": [], "core": 0,
                                                                   "frontend": core.FRONTEND.name})
    report, flags = bench_report.run(MLIR_SETTING, part="all", baseline=None, anchors=False, plain_pool=False,
                                     no_arena=True, rounds=1, runs=1, warm_up=0, turns=False, host_rows=False)
    label = core.frontend_label("mlir")
    assert label.startswith("Numba-CUDA-MLIR ")
    assert report["frontend"] == label and report["frontend_name"] == "mlir" and flags == []
    headings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("device: ")]
    assert [h.split("; ")[:3] for h in headings] == [["device: GPU", f"frontend: {label}", "date: today"]] * 4
    assert "allocator cost" in headings[0] and "cuda.device_array end to end" in headings[1]
    assert "CUDA graphs" in headings[2] and "stream overlap" in headings[3]


# -- RMM's rows under Numba-CUDA-MLIR -------------------------------------------------------------------

@pytest.mark.parametrize("rmm_installed", [True, False])
def test_under_mlir_rmms_end_to_end_rows_are_skipped_with_a_note_and_cupys_run(monkeypatch, capsys, rmm_installed):
    measured = []
    monkeypatch.setattr(end_to_end, "measure", fake_worker(measured))
    monkeypatch.setattr(anchors, "installed", lambda label: rmm_installed or label == "cupy (pool)")
    report = {}
    assert bench_report.end_to_end_part(report, MLIR_SETTING, anchors=True, no_arena=False, rounds=2,
                                        baseline=None, host_rows=False) == []
    out = capsys.readouterr().out
    assert not any(label.startswith("rmm") for label in measured) and "cupy (pool)" in measured
    assert [n for n in report["end_to_end_notes"] if n.startswith("rmm")] == RMM_NOTES
    assert all(f"note: {note}\n" in out for note in RMM_NOTES) and "rmm is not installed" not in out
    assert set(report["results"]) == {"default", "numba_pool", "numba_pool arena", "no-op floor", "Numba alone",
                                      "cupy (pool)"}


def test_under_numba_cuda_rmms_rows_still_run(monkeypatch):
    measured = []
    monkeypatch.setattr(end_to_end, "measure", fake_worker(measured))
    monkeypatch.setattr(anchors, "installed", lambda label: True)
    report = {}
    bench_report.end_to_end_part(report, SETTING, anchors=True, no_arena=False, rounds=1, baseline=None,
                                 host_rows=False)
    assert {"rmm (pool)", "rmm (cuda_async)", "cupy (pool)"} <= set(report["results"])
    assert not any("RMMNumbaManager" in note for note in report["end_to_end_notes"])


def test_under_mlir_the_allocator_part_skips_rmm_without_starting_it(monkeypatch):
    def rmm_in_process(context):
        raise AssertionError("RMM's plugin started under Numba-CUDA-MLIR")

    monkeypatch.setattr(anchors, "installed", lambda label: True)
    monkeypatch.setattr(anchors, "rmm_in_process", rmm_in_process)
    monkeypatch.setattr(anchors, "cupy_in_process", lambda context: {"cupy (pool)": (len, None)})
    memallocs, prepare, notes = anchors.in_process(context=None, frontend="mlir")
    assert memallocs == {"cupy (pool)": len} and prepare == {} and notes == RMM_NOTES


# -- numba-pool-tools bench --frontend ----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["bogus", "cuda", ""])
def test_a_bad_frontend_is_one_line_naming_the_option_and_exit_2(value):
    result_ = CliRunner().invoke(main, ["bench", "--frontend", value])
    assert isinstance(result_.exception, SystemExit) and result_.exit_code == 2
    line = check_one_line_error(result_.stderr, result_.stdout, f"--frontend={value!r}")
    assert "expected 'numba-cuda' (numba.cuda) or 'mlir' (numba_cuda_mlir.cuda)" in line


def test_a_bad_frontend_in_a_real_process_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "numba_pool_tools", "bench", "--frontend", "bogus"], cwd=PACKAGE_PARENT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    check_one_line_error(proc.stderr, proc.stdout, "--frontend='bogus'")


@pytest.fixture
def fake_gpu_bench(monkeypatch):
    """``numba-pool-tools bench`` on a fake GPU, ``report.run`` replaced: what it was given, and
    ``NUMBA_POOL_FRONTEND`` while it ran."""
    from numba_pool_tools.cli import bench

    asked = {}

    def run(setting, **options):
        asked.update(setting=setting, variable=os.environ.get(VARIABLE))
        return {"frontend_name": setting.frontend}, []

    monkeypatch.setattr(bench, "require_gpu", lambda: None)
    monkeypatch.setattr(core.cuda, "get_current_device", lambda: SimpleNamespace(name=b"Fake GPU"))
    monkeypatch.setattr(bench_report, "run", run)
    return asked


def test_frontend_spelled_as_the_variable_accepts_it_is_set_while_the_bench_runs_then_restored(fake_gpu_bench,
                                                                                                 monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    spelled = {"numba-cuda": "Numba_CUDA", "mlir": "numba-cuda-mlir"}[core.FRONTEND.name]
    result_ = CliRunner().invoke(main, ["bench", "--frontend", spelled])
    assert result_.exit_code == 0, result_.output
    assert fake_gpu_bench["setting"].frontend == fake_gpu_bench["variable"] == core.FRONTEND.name
    assert VARIABLE not in os.environ


def test_without_the_option_the_bench_runs_under_the_tools_frontend(fake_gpu_bench, monkeypatch):
    monkeypatch.setenv(VARIABLE, core.FRONTEND.name)
    result_ = CliRunner().invoke(main, ["bench"])
    assert result_.exit_code == 0, result_.output
    assert fake_gpu_bench["setting"].frontend == core.FRONTEND.name and os.environ[VARIABLE] == core.FRONTEND.name


def test_a_bad_variable_without_the_option_is_one_line_naming_it(monkeypatch):
    monkeypatch.setenv(VARIABLE, "fortran")
    result_ = CliRunner().invoke(main, ["bench"])
    assert result_.exit_code == 2
    check_one_line_error(result_.stderr, result_.stdout, f"{VARIABLE}='fortran' is not a frontend")


def test_another_frontend_than_the_one_the_bench_was_imported_under_is_one_line(fake_gpu_bench):
    result_ = CliRunner().invoke(main, ["bench", "--frontend", OTHER])
    assert result_.exit_code == 2 and "setting" not in fake_gpu_bench  # nothing measured under the wrong one
    check_one_line_error(result_.stderr, result_.stdout, f"--frontend {OTHER}: this process imported numba_pool_tools.bench "
                                                         f"under {core.FRONTEND.title} already")


CLI_ON_A_FAKE_GPU = """
import json, subprocess, sys, runpy
from types import SimpleNamespace
import numba_pool_tools.cli.bench as b

def setting(core, cuda, frontend):  # the device and the allocator process faked, nothing else
    from numba_pool_tools.bench import launch, report

    def run(argv, env, **options):
        said = {"sizes": {}, "notes": [], "core": 0, "frontend": env["NUMBA_POOL_FRONTEND"]}
        return subprocess.CompletedProcess(argv, 0, json.dumps(said), "")

    launch.subprocess = SimpleNamespace(run=run)
    return report.Setting("Fake GPU", "today", 0, frontend)

b.require_gpu = lambda: None
b._setting = setting
sys.argv = ["numba-pool-tools", *sys.argv[1:]]
runpy.run_module("numba_pool_tools", run_name="__main__")
"""


@BOTH
@pytest.mark.parametrize("chosen", frontends.NAMES)
def test_the_chosen_frontend_runs_the_bench_and_its_report_names_it(tmp_path, chosen):
    out = tmp_path / "report.json"
    inherited = next(name for name in frontends.NAMES if name != chosen)  # the option wins over the variable
    proc = python(CLI_ON_A_FAKE_GPU, {VARIABLE: inherited},
                  "bench", "--frontend", chosen, "--part", "allocator", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    label = core.frontend_label(chosen)
    assert f"device: Fake GPU; frontend: {label}; date: today; allocator cost" in proc.stdout
    report = json.loads(out.read_text())
    assert report["frontend"] == label and report["frontend_name"] == chosen
