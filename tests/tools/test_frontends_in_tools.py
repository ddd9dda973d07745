"""The tools under either Numba CUDA frontend, without a GPU: the kernel scripts' ``--frontend``
(bad values in one line, the no-GPU line naming the frontend), the kernels compiled once per
frontend, and ``numba-pool info``'s frontend rows, which import no frontend but the one in use.

Each check that loads a frontend runs in a fresh interpreter: loading both in this process would
make the public functions' frontend ambiguous for the other tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest

from helpers import FRONTENDS, GPU, MISSING_FRONTENDS, PACKAGE_PARENT, run_json, run_python
from numba_pool.cuda.frontend import MLIR, NAMES, NUMBA_CUDA, PACKAGES

SCRIPTS = ["sqrt", "increment", "fill"]
#: The environment of a fresh interpreter with no frontend chosen: the default (numba-cuda first).
UNCHOSEN = {"NUMBA_POOL_FRONTEND": ""}


def run_script(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m kernels.MODULE ARGS``."""
    return subprocess.run([sys.executable, "-m", f"kernels.{module}", *args], env={**os.environ, **(env or {})},
                          cwd=PACKAGE_PARENT, capture_output=True, text=True, timeout=300)


def check_script_error(proc: subprocess.CompletedProcess, script: str, *culprits: str, status: int = 2) -> str:
    """Assert that a kernel script failed as its bad options do: exit status ``status`` (2, bad
    input; 3, no GPU), one line on standard error, ``SCRIPT.py: ...`` naming each culprit, nothing
    on standard output, no traceback; return the line.  (``helpers.check_one_line_error`` is the
    command line's ``Error: ...`` form.)"""
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{script}.py: ") and all(c in lines[0] for c in culprits), lines[0]
    assert proc.stdout == "", proc.stdout
    return lines[0]


# -- the kernel scripts' --frontend -----------------------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bad_frontend_option_is_one_line_naming_it(script):
    proc = run_script(script, "--frontend", "bogus", "--iterations", "1")
    line = check_script_error(proc, script, "--frontend", "'bogus'")
    assert line == (f"{script}.py: error: argument --frontend: 'bogus' is not a frontend: expected 'numba-cuda' "
                    "(numba.cuda) or 'mlir' (numba_cuda_mlir.cuda)")


def test_a_bad_frontend_variable_is_one_line_naming_it():
    proc = run_script("sqrt", env={"NUMBA_POOL_FRONTEND": "cupy"})
    check_script_error(proc, "sqrt", "NUMBA_POOL_FRONTEND='cupy' is not a frontend")


def test_a_frontend_that_is_not_installed_is_one_line_saying_how_to_install_it():
    # A frontend's package that cannot be imported (None in sys.modules) is one not installed.
    code = ("import sys, runpy; sys.modules['numba_cuda_mlir'] = None; sys.argv = ['sqrt.py', '--frontend', 'mlir']\n"
            "runpy.run_module('kernels.sqrt', run_name='__main__')")
    proc = run_python(code)
    check_script_error(proc, "sqrt", "the Numba-CUDA-MLIR frontend (numba_cuda_mlir.cuda) is not installed",
                       "pip install '.[mlir]' in a numba-pool checkout")


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("script", SCRIPTS)
def test_without_gpu_the_line_names_the_frontend_chosen(script, frontend_name):
    # NUMBA_POOL_FRONTEND names the other frontend: --frontend wins over it.
    other = [name for name in NAMES if name != frontend_name][0]
    proc = run_script(script, "--frontend", frontend_name, env={"NUMBA_POOL_FRONTEND": other})
    line = check_script_error(proc, script, status=3)
    assert line == (f"{script}.py: no CUDA GPU is available here ({PACKAGES[frontend_name]}.is_available() is False): "
                    "this script runs kernels on one")


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
def test_the_variable_chooses_the_scripts_frontend_when_the_option_is_absent(frontend_name):
    proc = run_script("sqrt", env={"NUMBA_POOL_FRONTEND": frontend_name})
    check_script_error(proc, "sqrt", f"({PACKAGES[frontend_name]}.is_available() is False)", status=3)


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
@pytest.mark.skipif(MLIR not in FRONTENDS, reason=MISSING_FRONTENDS.get(MLIR, ""))
def test_a_script_under_mlir_imports_no_numba():
    code = ("import sys\nfrom kernels import sqrt\n"
            "try:\n    sqrt.main(['--frontend', 'mlir'])\nexcept SystemExit as exit:\n"
            "    print(exit.code, 'numba' in sys.modules, 'numba_cuda_mlir' in sys.modules)\n")
    proc = run_python(code, UNCHOSEN)
    assert proc.stdout.split() == ["3", "False", "True"], proc.stderr  # 3: no GPU


# -- the kernels, compiled once per frontend ----------------------------------------------------------

KERNELS_PER_FRONTEND = """
import json, sys
import kernels as kernels
from numba_pool.cuda.frontend import for_tools, load
from kernels import fill, increment, sqrt

out = {"imported at first": sorted(m for m in ("numba", "numba_cuda_mlir") if m in sys.modules)}
names = %r
for kernel in (kernels.fill_kernel, kernels.increment_kernel, kernels.sqrt_kernel):
    built = {name: kernel.for_frontend(name) for name in names}
    out[kernel.__name__] = {
        "same module attribute": kernel is getattr(sys.modules[kernel.__module__], kernel.__name__),
        "once per frontend": all(kernel.for_frontend(n) is built[n] and kernel.for_frontend(load(n)) is built[n]
                                 for n in names),
        "distinct": len({id(k) for k in built.values()}) == len(names),
        "dispatcher classes": {n: type(k).__module__.split(".")[0] for n, k in built.items()},
        "cuda of each copy": all(k.py_func.__globals__["cuda"] is load(n).cuda for n, k in built.items()),
        "python function untouched": kernel.function.__globals__["cuda"] is None,
        "tools' frontend": kernel.for_frontend() is built[for_tools().name] and kernel.py_func is built[
            for_tools().name].py_func,
    }
print(json.dumps(out))
"""


def test_each_frontend_compiles_its_own_kernel_once():
    out = run_json(KERNELS_PER_FRONTEND % (FRONTENDS,), UNCHOSEN)
    assert out.pop("imported at first") == []  # importing the kernels imports no frontend
    top_level = {NUMBA_CUDA: "numba", MLIR: "numba_cuda_mlir"}
    for name, checks in out.items():
        assert checks.pop("dispatcher classes") == {n: top_level[n] for n in FRONTENDS}, name
        assert checks == dict.fromkeys(checks, True), (name, checks)
    assert sorted(out) == ["fill_kernel", "increment_kernel", "sqrt_kernel"]


#: Each kernel's copy for a frontend compiled to PTX by that frontend (no GPU needed for PTX).
#: Numba-CUDA-MLIR asks the device for its compute capability even when given one: without a
#: GPU, its cached answer is set first (a private name of numba_cuda_mlir.tools, checked).
COMPILE_TO_PTX = """
import json, sys
from numba_pool.cuda.frontend import load
from kernels import fill_kernel, increment_kernel, sqrt_kernel
fe = load(%r)
if fe.name == "mlir":
    import numba_cuda_mlir.tools as tools
    assert hasattr(tools, "_cached_cc"), "numba_cuda_mlir.tools._cached_cc is gone: update this test"
    tools._cached_cc = (9, 0)
    from numba_cuda_mlir.numba_cuda import types
else:
    from numba.cuda import types
entries = {}
for kernel, sig in ((sqrt_kernel, (types.float32[:],)), (increment_kernel, (types.float32[:],)),
                    (fill_kernel, (types.float32[:], types.float32))):
    ptx, _ = fe.cuda.compile_ptx(kernel.python_function(fe), sig, cc=(9, 0))
    entries[kernel.__name__] = sum(kernel.__name__ in line for line in ptx.splitlines() if ".entry" in line)
print(json.dumps({"entries": entries, "imported": sorted(m for m in ("numba", "numba_cuda_mlir") if m in sys.modules)}))
"""


def test_each_frontend_compiles_the_kernels_copy_to_ptx(frontend_name):
    """The frontend's compiler resolves the copy's ``cuda.grid``: the frontend's own module is
    where the kernel finds it, and no other frontend is imported."""
    out = run_json(COMPILE_TO_PTX % frontend_name, UNCHOSEN)
    assert out == {"entries": {"sqrt_kernel": 1, "increment_kernel": 1, "fill_kernel": 1},
                   "imported": [{NUMBA_CUDA: "numba", MLIR: "numba_cuda_mlir"}[frontend_name]]}


def test_the_kernels_run_under_the_simulator_through_their_old_names():
    code = ("import numpy as np\nfrom kernels import fill_kernel, sqrt_kernel\n"
            "a = np.zeros(64, dtype=np.float32); sqrt_kernel[1, 64](a)\n"
            "b = np.zeros(64, dtype=np.float32); fill_kernel[1, 64](b, np.float32(3))\n"
            "print('{\"ok\": %s}' % str(bool(np.allclose(a, np.sqrt(np.arange(64))) and (b == 3).all())).lower())")
    assert run_json(code, {**UNCHOSEN, "NUMBA_ENABLE_CUDASIM": "1"}) == {"ok": True}


def test_a_bad_frontend_name_for_a_kernel_is_one_line():
    code = ("import numba_pool\nfrom kernels import sqrt_kernel\ntry:\n    sqrt_kernel.for_frontend('cupy')\n"
            "except numba_pool.FrontendError as err:\n    print(err)")
    proc = run_python(code)
    assert proc.stdout.strip() == ("numba_pool: kernels: frontend='cupy' is not a frontend: expected "
                                   "'numba-cuda' (numba.cuda) or 'mlir' (numba_cuda_mlir.cuda)"), proc.stderr


# -- numba-pool info ----------------------------------------------------------------------------------

#: ``numba-pool info`` in process (Click's runner), then what it imported, as JSON.
INFO = """
import json, sys
from click.testing import CliRunner
from numba_pool.cli import main
result = CliRunner().invoke(main, ["info"])
print(json.dumps({"exit": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                  "imported": sorted(m for m in ("numba", "numba_cuda_mlir") if m in sys.modules)}))
"""


def info_rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.strip().splitlines():
        name, _, value = line.partition("  ")
        rows[name.strip()] = value.strip()
    return rows


def version(distribution: str) -> str:
    return metadata.version(distribution)


@pytest.mark.skipif(FRONTENDS != list(NAMES), reason="needs both frontends installed: "
                    + "; ".join(MISSING_FRONTENDS.values()))
@pytest.mark.skipif(GPU, reason="checks the rows printed before the no-GPU error")
def test_info_lists_both_frontends_with_versions_and_the_default_choice():
    out = run_json(INFO, UNCHOSEN)
    assert out["exit"] == 3, out
    rows = info_rows(out["stdout"])
    assert rows["frontend numba-cuda"] == (f"installed: numba-cuda {version('numba-cuda')}, numba {version('numba')} "
                                           "(numba.cuda)")
    assert rows["frontend mlir"] == f"installed: numba-cuda-mlir {version('numba-cuda-mlir')} (numba_cuda_mlir.cuda)"
    assert rows["frontend in use"] == ("numba-cuda: the default (NUMBA_POOL_FRONTEND is not set; numba-cuda first when "
                                       "both are)")
    assert out["imported"] == ["numba"]  # the one in use, for its GPU check
    assert "numba.cuda.is_available() is False" in out["stderr"]


@pytest.mark.skipif(MLIR not in FRONTENDS, reason=MISSING_FRONTENDS.get(MLIR, ""))
@pytest.mark.skipif(GPU, reason="checks the rows printed before the no-GPU error")
def test_info_under_mlir_says_so_and_imports_no_numba():
    out = run_json(INFO, {"NUMBA_POOL_FRONTEND": "mlir"})
    assert out["exit"] == 3, out
    rows = info_rows(out["stdout"])
    assert rows["frontend in use"] == "mlir (Numba-CUDA-MLIR): NUMBA_POOL_FRONTEND=mlir"
    assert rows["frontend mlir"].startswith(f"installed: numba-cuda-mlir {version('numba-cuda-mlir')}")
    assert "frontend numba-cuda" in rows  # listed, from its metadata: not imported
    assert out["stderr"].strip() == ("Error: no CUDA GPU is available here (numba_cuda_mlir.cuda.is_available() is "
                                     "False): numba-pool needs one for this command")
    assert out["imported"] == ["numba_cuda_mlir"]


def test_info_names_a_frontend_that_is_not_installed_then_fails_in_one_line():
    code = "import sys; sys.modules['numba_cuda_mlir'] = None\n" + INFO
    out = run_json(code, {"NUMBA_POOL_FRONTEND": "mlir"})
    assert out["exit"] == 2, out
    rows = info_rows(out["stdout"])
    assert rows["frontend mlir"] == "not installed (pip install '.[mlir]' in a numba-pool checkout)"
    assert rows["frontend in use"] == "mlir (Numba-CUDA-MLIR): NUMBA_POOL_FRONTEND=mlir"
    assert out["stderr"].strip() == ("Error: numba_pool: the Numba-CUDA-MLIR frontend (numba_cuda_mlir.cuda) is not "
                                     "installed: pip install '.[mlir]' in a numba-pool checkout")


def test_info_refuses_a_bad_frontend_variable_in_one_line_before_anything():
    out = run_json(INFO, {"NUMBA_POOL_FRONTEND": "cupy"})
    assert (out["exit"], out["stdout"]) == (2, "")
    assert out["stderr"].strip() == ("Error: numba_pool: NUMBA_POOL_FRONTEND='cupy' is not a frontend: expected "
                                     "'numba-cuda' (numba.cuda) or 'mlir' (numba_cuda_mlir.cuda)")
    assert out["imported"] == []


def test_the_gpu_check_of_the_commands_uses_the_tools_frontend(frontend_name):
    """``numba-pool-tools bench`` and ``info`` ask the frontend in use whether there is a GPU."""
    code = ("import json, sys\nfrom numba_pool.cli import errors\n"
            "print(json.dumps({'gpu': errors.gpu_available(), 'frontend': errors.tools_frontend().name,"
            " 'imported': sorted(m for m in ('numba', 'numba_cuda_mlir') if m in sys.modules)}))")
    out = run_json(code, {"NUMBA_POOL_FRONTEND": frontend_name})
    assert (out["frontend"], out["imported"]) == (frontend_name, [{NUMBA_CUDA: "numba", MLIR: "numba_cuda_mlir"}[frontend_name]])
    if not GPU:
        assert out["gpu"] is False
