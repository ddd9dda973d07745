"""The package's shape: the import contracts of setup.cfg (layers, no cycles, no Dask or plotting
under the allocation path, no frontend imported outside numba_pool.cuda.frontend) hold, each fails on a planted breach, and no module or class grows past
the sizes a reader can hold (about 500 and 300 lines)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import numba_pool
from helpers import REPO

PACKAGE = Path(numba_pool.__file__).resolve().parent
#: The most lines a module, and a class, may have.
MODULE_LINES, CLASS_LINES = 500, 300


def lint_imports(package_parent: Path | str) -> subprocess.CompletedProcess:
    """import-linter's check of setup.cfg's contracts on the numba_pool found in
    ``package_parent``, without its cache (nothing is written in the checkout)."""
    code = ("import sys\nfrom importlinter.cli import lint_imports\n"
            f"sys.exit(lint_imports(config_filename={str(Path(REPO) / 'setup.cfg')!r}, no_cache=True, no_logo=True))")
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=package_parent)


def test_the_import_contracts_hold():
    proc = lint_imports(PACKAGE.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in proc.stdout, proc.stdout[-2000:]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """``plant(module, line)``: a copy of the package with ``line`` added to ``module`` (a path
    inside the package); returns the folder holding the copy."""
    def plant(module: str, line: str) -> Path:
        parent = tmp_path_factory.mktemp("planted")
        shutil.copytree(PACKAGE, parent / "numba_pool", ignore=shutil.ignore_patterns("__pycache__"))
        with open(parent / "numba_pool" / module, "a") as f:
            f.write(f"\n{line}  # planted\n")
        return parent
    return plant


LAYERS = "Layers: every module imports only the layers below its own"
ACYCLIC = "No import cycles, within any package"
RUNTIME = "What Numba's allocations run through imports neither Dask"
FRONTEND = "Only numba_pool.cuda.frontend imports a Numba CUDA frontend"
CONTRACTS = (LAYERS, ACYCLIC, RUNTIME, FRONTEND)


@pytest.mark.parametrize("module, line, broken, named", [
    # An upward import is a cycle too: the plugin imports the allocator.
    ("allocator/usage.py", "from ..plugin import api", {LAYERS, ACYCLIC},
     "numba_pool.allocator.usage -> numba_pool.plugin.api"),
    ("allocator/free_list.py", "from . import arena", {ACYCLIC}, "numba_pool.allocator"),
    ("observe/summary.py", "import matplotlib", {RUNTIME}, "numba_pool.observe.summary -> matplotlib"),
    # Even inside a function, as the tools' old `from numba import cuda` were.
    ("kernels/__init__.py", "def f():\n    from numba import cuda", {FRONTEND}, "numba_pool.kernels -> numba"),
    ("plugin/api.py", "import numba_cuda_mlir.cuda", {FRONTEND}, "numba_pool.plugin.api -> numba_cuda_mlir"),
], ids=["upward import", "cycle", "plotting under the allocation path", "numba-cuda in a tool", "mlir in the plugin"])
def test_each_contract_fails_on_a_planted_breach(planted, module, line, broken, named):
    proc = lint_imports(planted(module, line))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert verdicts(proc.stdout) == {c: "BROKEN" if c in broken else "KEPT" for c in CONTRACTS}
    assert named in proc.stdout, proc.stdout[-3000:]


def verdicts(report: str) -> dict[str, str]:
    """import-linter's verdict on each contract, from its report (long names wrap there)."""
    summary = " ".join(report.split("Contracts:")[0].split())
    return {contract: re.search(re.escape(contract) + r".*? (KEPT|BROKEN)", summary)[1]
            for contract in CONTRACTS}


def oversized(source: str, name: str) -> list[str]:
    """What in ``source`` (the text of file ``name``) is over :data:`MODULE_LINES` or
    :data:`CLASS_LINES`, one line each."""
    found = []
    lines = source.count("\n")
    if lines > MODULE_LINES:
        found.append(f"{name}: {lines} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LINES:
            found.append(f"{name}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    return found


def test_no_module_or_class_is_too_long_to_read():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += oversized(path.read_text(), str(path.relative_to(PACKAGE)))
    assert found == []


def test_the_size_check_finds_a_long_class():
    body = "\n".join(f"    x{i} = {i}" for i in range(CLASS_LINES))
    assert oversized(f"class Long:\n{body}\n", "long.py") == [f"long.py: class Long, {CLASS_LINES + 1} lines"]
    assert oversized("x = 1\n" * (MODULE_LINES + 1), "long.py") == [f"long.py: {MODULE_LINES + 1} lines"]
