"""numba_pool under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), no GPU needed.

Test suites run under the simulator with the production environment, so ``import numba_pool``,
``install()``, ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` and the command line must let them run.
numba.cuda picks the simulator when it is imported: each check runs in a fresh interpreter.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from helpers import DATA, PACKAGE_PARENT, run_python

SIM = {"NUMBA_ENABLE_CUDASIM": "1"}
SIM_WITH_PLUGIN = {**SIM, "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"}

# A small simulator program: cuda.jit kernel, to_device, device_array, copy_to_host.
KERNEL_PROGRAM = """
import json, sys
import numpy as np
from numba import cuda

@cuda.jit
def add_one(a, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = a[i] + 1

a = np.arange(100, dtype=np.float32)
d_a = cuda.to_device(a)
d_out = cuda.device_array(a.size, dtype=np.float32)
add_one[4, 32](d_a, d_out)
out = d_out.copy_to_host()
print(json.dumps({"ok": bool((out == a + 1).all()), "numba_pool_imported": "numba_pool" in sys.modules,
                  "context": type(cuda.current_context()).__name__}))
"""


def run_sim(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_python(code, {**SIM, **(env or {})}, timeout=120)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("import_numba_pool", [False, True])
def test_kernel_runs_with_the_memory_manager_variable_set(import_numba_pool):
    """numba-cuda ignores NUMBA_CUDA_MEMORY_MANAGER under the simulator (only the real driver
    imports the named module): the program runs on the simulator's own arrays, and numba_pool
    says so once when it is imported."""
    code = ("import numba_pool\n" if import_numba_pool else "") + KERNEL_PROGRAM
    proc = run_sim(code, SIM_WITH_PLUGIN)
    result = last_json(proc)
    assert result == {"ok": True, "numba_pool_imported": import_numba_pool, "context": "FakeCUDAContext"}
    notes = [line for line in proc.stderr.splitlines() if "SimulatorWarning" in line]
    if import_numba_pool:
        assert len(notes) == 1, proc.stderr
        assert "NUMBA_CUDA_MEMORY_MANAGER=numba_pool is ignored: the CUDA simulator is on" in notes[0]
        assert notes[0].startswith("<string>:1: SimulatorWarning")  # points at the user's import
    else:
        assert notes == [], proc.stderr


def test_warnings_as_errors_do_not_stop_the_import():
    code = "import warnings\nwarnings.simplefilter('error', UserWarning)\nimport numba_pool\n" + KERNEL_PROGRAM
    assert last_json(run_sim(code, SIM_WITH_PLUGIN))["ok"]


def test_install_warns_once_and_the_program_goes_on():
    code = """
import json, warnings
from numba import cuda
import numba_pool
from numba_pool_tools.bench import noop
from numba_pool.plugin import manager

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    config = numba_pool.install(arena=True, max_size="1 GiB")
out = {"config": [config.arena, config.max_size],
       "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught]}
try:
    numba_pool.install(max_size="lots")
except numba_pool.ConfigError as err:
    out["bad option"] = str(err)
for name, call in [("stats", numba_pool.stats), ("trim", numba_pool.trim),
                   ("manager", lambda: manager.NumbaPoolManager(context=None)),
                   ("noop", lambda: noop.NoopManager(context=None))]:
    try:
        call()
        out[name] = None
    except RuntimeError as err:
        out[name] = str(err)
out["numba.cuda untouched"] = not hasattr(cuda, "MemoryPointer") and not hasattr(cuda, "HostOnlyCUDAMemoryManager")
print(json.dumps(out))
"""
    proc = run_sim(code + KERNEL_PROGRAM)
    result = last_json(proc)  # the kernel's, after install()
    out = json.loads(proc.stdout.strip().splitlines()[-2])
    assert out["config"] == [True, 1 << 30]
    assert out["warnings"] == [["SimulatorWarning",
                                "numba_pool.install() does nothing: the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): "
                                "it keeps device arrays in host memory and has no memory manager for numba_pool to "
                                "replace", "<string>"]]
    assert "install(max_size)='lots'" in out["bad option"]
    assert out["stats"] == out["trim"] == ("numba_pool is not the memory manager: the CUDA simulator is on "
                                           "(NUMBA_ENABLE_CUDASIM=1): it keeps device arrays in host memory and "
                                           "has no memory manager for numba_pool to replace")
    for name, cls in [("manager", "NumbaPoolManager"), ("noop", "NoopManager")]:
        assert out[name].startswith(f"numba_pool: {cls} cannot be used: the CUDA simulator is on"), out[name]
    assert out["numba.cuda untouched"]
    assert result["ok"]  # a kernel still runs after install()


def numba_pool_cli(*args, env=None, module="numba_pool"):
    """``python -m module ARGS``: ``numba-pool``, or the tools' ``numba-pool-tools`` (``numba_pool_tools``)."""
    return subprocess.run([sys.executable, "-m", module, *args], env={**os.environ, **SIM, **(env or {})},
                          cwd=PACKAGE_PARENT, capture_output=True, text=True, timeout=120)


#: The package of each command's command line.
COMMANDS = {"info": "numba_pool", "bench": "numba_pool_tools", "replay": "numba_pool_tools"}


@pytest.mark.parametrize("env", [SIM, SIM_WITH_PLUGIN], ids=["simulator", "simulator+variable"])
def test_cli_help_and_replay(env):
    proc = numba_pool_cli("--help", env=env, module=COMMANDS["replay"])
    assert proc.returncode == 0, proc.stderr
    assert "replay" in proc.stdout and "Traceback" not in proc.stderr
    logs = sorted(glob.glob(os.path.join(DATA, "*.csv")))
    assert logs
    proc = numba_pool_cli("replay", logs[0], env=env, module=COMMANDS["replay"])
    assert proc.returncode == 0, proc.stderr
    assert "peak reserved / peak requested" in proc.stdout


@pytest.mark.parametrize("command", ["info", "bench"])
def test_cli_commands_needing_a_gpu_say_simulator_in_one_line(command):
    proc = numba_pool_cli(command, module=COMMANDS[command])
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "Error: no CUDA GPU here: the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): it keeps device arrays in host "
        "memory and has no memory manager for numba_pool to replace"]
    if command == "info":  # versions and configuration first
        for row in ("numba-cuda", "numba-pool", "config: arena"):
            assert row in proc.stdout


def test_real_path_uses_the_frontends_classes(frontend_name):
    """Outside the simulator each frontend's managers and pointers derive from its own classes,
    which numba_pool takes from one place (numba_pool.cuda.frontend)."""
    import numba_pool
    from numba_pool.cuda import frontend as frontends
    from numba_pool.cuda import pointers
    from numba_pool.plugin.manager import manager_class

    frontend = frontends.load(frontend_name)
    cuda = frontend.cuda
    assert not frontend.simulator
    assert issubclass(manager_class(frontend), cuda.HostOnlyCUDAMemoryManager)
    assert issubclass(manager_class(frontend), numba_pool.NumbaPoolManager)
    assert issubclass(frontend.PoolPointer, cuda.MemoryPointer) and issubclass(frontend.PoolPointer, pointers.PoolPointer)
    assert frontend.MemoryPointer is cuda.MemoryPointer
    assert manager_class(frontend) is manager_class(frontend)  # one class per frontend


def numba_pool_file() -> str:
    import numba_pool

    return numba_pool.__file__


@pytest.mark.parametrize("module", ["increment", "sqrt", "fill"])
@pytest.mark.parametrize("plugin", [False, True], ids=["default", "plugin"])
def test_kernel_scripts_run_to_completion_under_the_simulator_in_seconds(module, plugin):
    env = {**SIM, **({"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"} if plugin else {})}
    proc = run_python(f"import runpy, sys; sys.argv = ['{module}.py']; "
                      f"runpy.run_module('kernels.{module}', run_name='__main__')", env, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("under the CUDA simulator (no memory manager), frontend numba-cuda"), proc.stdout
    assert "x 3" in proc.stdout  # the simulator's defaults: 1024 elements x 3 rounds


def test_the_summary_option_says_in_one_line_why_there_is_none():
    proc = run_python("import runpy, sys; sys.argv = ['sqrt.py', '--summary']; "
                      "runpy.run_module('kernels.sqrt', run_name='__main__')", SIM_WITH_PLUGIN, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == (
        "numba_pool: no memory summary: the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): "
        "it keeps device arrays in host memory and has no memory manager for numba_pool to replace")


def test_warnings_as_errors_do_not_stop_install_either():
    """``python -W error``: install() behaves as the import does (warns, never raises), so a test
    suite run with warnings as errors under the simulator keeps its production set-up."""
    code = "import numba_pool\nconfig = numba_pool.install(arena=True)\nprint('{\"arena\": %s}' % str(config.arena).lower())\n"
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], env={**os.environ, **SIM_WITH_PLUGIN},
                          cwd=PACKAGE_PARENT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"arena": True}


def test_a_statistics_scope_warns_that_it_counts_nothing():
    code = """
import json, warnings
import numpy as np
from numba import cuda
import numba_pool

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with numba_pool.statistics() as s:
        cuda.to_device(np.ones(1000))
print(json.dumps({"warnings": [(w.category.__name__, str(w.message), w.filename, w.lineno) for w in caught],
                  "counted": [s.total_count, s.peak_bytes]}))
"""
    out = last_json(run_sim(code))
    assert out["counted"] == [0, 0]
    assert out["warnings"] == [["SimulatorWarning", "numba_pool.statistics() counts nothing: the CUDA simulator is on "
                                "(NUMBA_ENABLE_CUDASIM=1): it keeps device arrays in host memory and has no memory "
                                "manager for numba_pool to replace", "<string>", 9]]


def test_a_typo_warning_from_install_points_at_the_install_line():
    code = """
import json, warnings
import numba_pool
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    numba_pool.install()
print(json.dumps([(w.category.__name__, w.filename, w.lineno) for w in caught]))
"""
    typo = "NUMBA_POOL_" + "AREN"  # spelled in two parts: the repository's scan of used variables skips it
    out = last_json(run_sim(code, {typo: "1"}))
    assert ["ConfigWarning", "<string>", 6] in out and ["SimulatorWarning", "<string>", 6] in out, out
