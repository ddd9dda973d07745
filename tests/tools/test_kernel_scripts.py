"""The example kernel scripts of the checkout's ``kernels/`` folder, run as the README runs them
(``python kernels/sqrt.py``) and as modules (``python -m kernels.sqrt``): one line naming the
culprit on standard error, exit status 2 for bad input (a bad ``NUMBA_POOL_*`` variable, bad
counts, arrays larger than the machine's memory, an unwritable ``--snapshot`` path) and 3 for a
machine without a GPU, as ``numba-pool``'s; warnings as one line naming the script; and
importable from the checkout with no install."""

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
def test_kernel_scripts_without_gpu_one_line_and_exit_3(name):
    proc = script(name, "--iterations", "1")
    assert proc.returncode == 3, proc.stderr  # 3, as numba-pool's: 2 is bad input
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


# -- bad input and the simulator (issue 36) --------------------------------------------------------

SIMULATOR = {"NUMBA_ENABLE_CUDASIM": "1"}


def stderr_lines(proc: subprocess.CompletedProcess, name: str = "sqrt") -> list[str]:
    """Standard error's lines, each checked to be the script's own one-line kind: no traceback, no frame."""
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and all(line.startswith(f"{name}.py: ") for line in lines), proc.stderr
    return lines


def test_more_elements_than_the_machine_holds_are_refused_in_one_line():
    proc = script("sqrt", "--n", "100000000000", env=SIMULATOR)  # numpy's _ArrayMemoryError traceback, before
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    [line] = stderr_lines(proc)
    assert line.startswith("sqrt.py: error: argument --n: '100000000000': 100,000,000,000 elements of 4 bytes take "
                           "372.5 GiB, more than this machine's memory"), line


def test_running_out_of_memory_during_a_round_is_one_line_exit_2(capsys, monkeypatch):
    from kernels import _script

    def main():
        raise MemoryError("Unable to allocate 745. GiB for an array with shape (100000000000,) and data type float64")

    monkeypatch.setattr(sys, "argv", ["sqrt.py"])
    with pytest.raises(SystemExit) as exit:
        _script.run(main)
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "sqrt.py: out of memory: Unable to allocate 745. GiB for an array with shape (100000000000,) and data type "
        "float64: try a smaller --n"]


@pytest.mark.parametrize("where, problem", [
    ("/nonexistent/x.pkl", "--snapshot='/nonexistent/x.pkl' is in folder '/nonexistent', which does not exist"),
    ("{tmp}", "--snapshot='{tmp}' is a folder"),
])
def test_an_unwritable_snapshot_path_is_refused_before_running(where, problem, tmp_path):
    proc = script("sqrt", "--snapshot", where.format(tmp=tmp_path), env=SIMULATOR)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)  # nothing ran
    assert stderr_lines(proc) == [f"sqrt.py: error: {problem.format(tmp=tmp_path)}: expected the path of a snapshot "
                                  "file (a pickle) to write"]


def test_a_snapshot_under_the_simulator_is_written_or_one_line_says_why_not(tmp_path):
    """Whether the simulator can give a snapshot is the library's to say: written, exit status 0;
    else one line on standard error naming the file and why, exit status 3 (no GPU), not 0."""
    dump = tmp_path / "dump.pickle"
    proc = script("sqrt", "--snapshot", str(dump), env=SIMULATOR)
    assert proc.stdout.startswith("sqrt: OK (1024 elements x 3) under the CUDA simulator"), proc.stdout
    lines = stderr_lines(proc)
    if proc.returncode == 0:
        assert dump.exists() and f"snapshot: {dump}:" in proc.stdout
    else:
        assert proc.returncode == 3 and not dump.exists(), proc.stderr
        assert lines[-1].startswith(f"sqrt.py: --snapshot: no snapshot written to {dump}: numba_pool is not the "
                                    "memory manager: the CUDA simulator is on"), lines


def test_warnings_are_one_line_naming_the_script_not_runpy():
    """``python -m kernels.sqrt``: numba_pool's import-time warning named ``<frozen runpy>:112``, then a
    file of the checkout; now the script, on one line."""
    proc = subprocess.run([sys.executable, "-m", "kernels.sqrt", "--iterations", "1"], cwd=REPO, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, **SIMULATOR, "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    assert proc.returncode == 0, proc.stderr
    assert stderr_lines(proc) == [
        "sqrt.py: warning: NUMBA_CUDA_MEMORY_MANAGER=numba_pool is ignored: the CUDA simulator is on "
        "(NUMBA_ENABLE_CUDASIM=1): it keeps device arrays in host memory and has no memory manager for numba_pool to "
        "replace"]
