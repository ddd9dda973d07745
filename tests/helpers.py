"""What many tests share: the frontend under test, whether a GPU is here, and running code in a
fresh interpreter.

The frontend under test is the tools' choice (:func:`numba_pool.cuda.frontend.for_tools`):
``NUMBA_POOL_FRONTEND=mlir pytest`` runs the GPU tests under Numba-CUDA-MLIR, and subprocesses
inherit the variable.  :data:`cuda` is that frontend's ``cuda`` module; the CPU tests that
concern both frontends use :data:`FRONTENDS`.

Importable from every test folder: ``pyproject.toml`` puts ``tests/`` on ``sys.path``
(pytest's ``pythonpath``).  Kept apart from ``conftest.py``, which pytest imports under a name
of its own: a second import of it as ``conftest`` would run its set-up twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba_pool
from numba_pool.cuda import frontend as frontends

#: The frontend under test, and its ``cuda`` module (``numba.cuda`` or ``numba_cuda_mlir.cuda``).
FRONTEND = frontends.for_tools()
cuda = FRONTEND.cuda
#: The frontends this environment has; the tests that concern both run once per frontend here,
#: and say which is missing and why (:data:`MISSING_FRONTENDS`).
FRONTENDS = [name for name in frontends.NAMES if name in frontends.installed()]
MISSING_FRONTENDS = {name: f"{frontends.TITLES[name]} is not installed ({frontends.EXTRAS[name]})"
                     for name in frontends.NAMES if name not in FRONTENDS}
GPU = cuda.is_available()
#: Why numba-cuda cannot compile kernels here, or None: numba-cuda 0.30 registers
#: ``np.row_stack``, which numpy 2.5 removed (an environment with Numba-CUDA-MLIR's numpy).
NUMBA_CUDA_CANNOT_COMPILE = None
if "numba-cuda" in FRONTENDS:
    import numpy as _np

    if not hasattr(_np, "row_stack"):
        NUMBA_CUDA_CANNOT_COMPILE = f"numba-cuda 0.30 cannot compile kernels under numpy {_np.__version__} (no np.row_stack)"
#: A line of Python that binds ``cuda`` to the frontend under test, for the programs the tests
#: run in a fresh interpreter (which inherits ``NUMBA_POOL_FRONTEND``).
CUDA_IMPORT = "from numba_pool.cuda.frontend import for_tools; cuda = for_tools().cuda"
#: The tests' folder, the logs recorded from the kernel scripts in it, and the checkout.
TESTS = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(TESTS, "data")
REPO = os.path.dirname(TESTS)
# Subprocesses start here so that they import the numba_pool under test, not a source checkout
# in the current directory.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(numba_pool.__file__)))
#: What pytest's ``pythonpath`` (pyproject.toml) gives the tests, the tools and the example
#: kernels from the checkout, given to every program they start too: pytest sets ``sys.path``
#: only, and a fresh interpreter reads ``PYTHONPATH``.
CHECKOUT_PATHS = [os.path.join(REPO, "tools"), REPO]
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
    CHECKOUT_PATHS + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def check_one_line_error(stderr: str, stdout: str, culprit: str) -> str:
    """Assert that a command failed the way the command line promises: one line on standard
    error, ``Error: ...`` naming ``culprit``, nothing on standard output, no traceback; return
    the line."""
    assert "Traceback" not in stderr + stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: ") and culprit in lines[0], lines[0]
    assert stdout == "", stdout  # checked before anything is printed
    return lines[0]


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


class AnyStreamsIdleBlocks(dict):
    """A planted bug for rule 7a's tests: a stream-idle table (``StreamIdle.lists``) whose lookup, finding no block
    for ``(stream id, bytes)``, answers with another stream's non-empty list of the size (so an allocation takes
    another stream's block, and a release may land in another stream's list)."""

    def get(self, key, default=None):
        found = super().get(key)
        if found:
            return found
        return next((blocks for (_, size), blocks in list(self.items()) if size == key[1] and blocks), default)
