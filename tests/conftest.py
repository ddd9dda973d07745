"""Shared test set-up.

GPU tests carry the ``gpu`` marker and are skipped when ``numba.cuda.is_available()`` is false.
When a GPU is there, numba_pool is installed as Numba's memory manager before any context
exists, with the options of the ``NUMBA_POOL_*`` environment (so ``NUMBA_POOL_ARENA=1 pytest``
runs the same GPU tests in arena mode).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from numba import cuda

import numba_pool

GPU = cuda.is_available()
# Subprocesses start here so that they import the numba_pool under test (the installed one),
# not a source checkout in the current directory.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(numba_pool.__file__)))

if GPU:
    numba_pool.install()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (numba.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (Numba binds the memory manager per process)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code], env=full_env, cwd=PACKAGE_PARENT, capture_output=True,
                          text=True, timeout=timeout)


def run_json(code: str, env: dict | None = None) -> dict:
    """Run ``code``, which prints one JSON object last, and return that object."""
    proc = run_python(code, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
