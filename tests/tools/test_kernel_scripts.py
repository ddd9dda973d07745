"""The example kernel scripts of the checkout's ``kernels/`` folder, run as the README runs them
(``python kernels/sqrt.py``) and as modules (``python -m kernels.sqrt``): one line naming the
culprit on standard error, exit status 2, for a machine without a GPU, a bad ``NUMBA_POOL_*``
variable and bad counts; and importable from the checkout with no install."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import FRONTEND, GPU, REPO
from numba_pool.cuda.frontend import PACKAGES

SCRIPTS = ["increment", "sqrt", "fill"]


def script(name: str, *args, env=None, cwd=REPO) -> subprocess.CompletedProcess:
    """``python kernels/NAME.py ARGS`` from the checkout's top level (the README's command)."""
    return subprocess.run([sys.executable, os.path.join("kernels", f"{name}.py"), *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("name", SCRIPTS)
def test_kernel_scripts_without_gpu_one_line_and_exit_2(name):
    proc = script(name, "--iterations", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"{name}.py: no CUDA GPU is available here ({PACKAGES[FRONTEND.name]}.is_available() is "
        "False): this script runs kernels on one"]


def test_kernel_scripts_name_a_bad_variable_in_one_line_before_anything_runs():
    proc = script("sqrt", "--iterations", "1", env={"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool",
                                                      "NUMBA_POOL_ARENA_MAX_BLOCK": "1000"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sqrt.py: NUMBA_POOL_ARENA_MAX_BLOCK='1000'"), lines


@pytest.mark.parametrize("argument, culprit", [
    (["--iterations", "-1"], "argument --iterations: '-1': must be at least 1"),
    (["--keep", "-5"], "argument --keep: '-5': must be at least 0"),
    (["--iterations", "two"], "argument --iterations: 'two' is not a whole number"),
])
def test_kernel_scripts_refuse_bad_counts_in_one_line(argument, culprit):
    proc = script("sqrt", *argument)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"sqrt.py: error: {culprit}"], proc.stderr


def test_a_script_runs_from_any_folder_and_without_pythonpath(tmp_path):
    """``python /path/to/kernels/sqrt.py`` from elsewhere, with no ``PYTHONPATH``: the script
    finds its ``kernels`` package (and, with no numba_pool installed, the checkout's) itself."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "kernels", "sqrt.py"), "--keep", "-5"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "sqrt.py: error: argument --keep: '-5': must be at least 0"], proc.stderr


def test_kernels_import_from_a_checkout_without_the_editable_finder():
    """``import kernels.sqrt`` at a checkout's top level, numba_pool installed or not: only
    sys.path's finder; kernels are the checkout's, and no copy is in the library."""
    code = ("import sys, os; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in repr(f)]\n"
            "sys.path.insert(0, os.getcwd())\n"
            "import numba_pool, kernels.sqrt as s, importlib.util\n"
            "print(os.path.dirname(numba_pool.__file__), s.__file__, importlib.util.find_spec('numba_pool.kernels'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [os.path.join(REPO, "numba_pool"), os.path.join(REPO, "kernels", "sqrt.py"), "None"]
