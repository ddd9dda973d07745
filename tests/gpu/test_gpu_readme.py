"""The README's commands, run as written on a GPU: the main job (an example kernel under the
plugin, printing its memory summary) and the quick-start program.

The main job's kernel script runs under the frontend under test (it inherits
``NUMBA_POOL_FRONTEND``); the quick-start program runs under the frontend it imports, whatever
the frontend under test.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from helpers import FRONTENDS, GPU, MISSING_FRONTENDS, NUMBA_CUDA_CANNOT_COMPILE, PACKAGE_PARENT, REPO
from readme_text import code_blocks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")]


def without_plugin_env() -> dict:
    env = dict(os.environ)
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    return env


def test_the_main_job_command_prints_the_memory_summary():
    (command,) = [block.strip() for block in code_blocks("Two commands", "bash") if "kernels" in block]
    words = shlex.split(command)
    assignments = dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("-"))
    argv = [word for word in words if word not in {f"{k}={v}" for k, v in assignments.items()}]
    assert argv[0] == "python"
    # From the checkout's top level, where the README's commands run (kernels/ is there).
    proc = subprocess.run([sys.executable, *argv[1:]], env={**without_plugin_env(), **assignments},
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert "sqrt: OK" in proc.stdout and "under NumbaPoolManager" in proc.stdout
    assert "numba_pool memory summary: device 0" in proc.stdout


def test_the_quick_start_runs_as_written():
    (program,) = code_blocks("Quick start", "python")
    proc = _run_readme_program(program)
    assert "numba_pool memory summary: device 0" in proc.stdout and "allocations" in proc.stdout


def test_the_managed_memory_example_runs_after_the_quick_start():
    """The "Managed memory" example, run with the quick start's imports and kernel: the CPU reads
    what the kernel computed, the array is numba_pool's, and the prefetches are accepted."""
    (program,) = code_blocks("Quick start", "python")
    (managed,) = code_blocks("Managed memory", "python")
    check = ("\nfrom numba_pool.cuda.pointers import PooledManagedMemory\n"
             "assert isinstance(a.gpu_data, PooledManagedMemory) and (a[:4] == 2.0).all()\nprint('managed: OK')\n")
    proc = _run_readme_program(program + "\n" + managed + check)
    assert "managed: OK" in proc.stdout and "[2. 2. 2. 2.]" in proc.stdout


def _run_readme_program(program: str) -> subprocess.CompletedProcess:
    if "from numba import cuda" in program and "numba-cuda" not in FRONTENDS:
        pytest.skip(f"the README's quick start uses numba.cuda: {MISSING_FRONTENDS['numba-cuda']}")
    if "from numba import cuda" in program and NUMBA_CUDA_CANNOT_COMPILE:
        pytest.skip(f"the README's quick start uses numba.cuda: {NUMBA_CUDA_CANNOT_COMPILE}")
    if "numba_cuda_mlir" in program and "mlir" not in FRONTENDS:
        pytest.skip(f"the README's quick start uses numba_cuda_mlir.cuda: {MISSING_FRONTENDS['mlir']}")
    proc = subprocess.run([sys.executable, "-c", program], env=without_plugin_env(), cwd=PACKAGE_PARENT,
                          capture_output=True, text=True, timeout=300)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    return proc
