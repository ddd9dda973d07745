"""The package's shape: the import contracts of setup.cfg (layers, no cycles, no Dask or plotting
under the allocation path, no frontend imported outside numba_pool.cuda.frontend, the library
importing neither the tools nor the example kernels beside it, the tools' own layers) hold, each
fails on a planted breach, and no module or class, in the library, the tools or the kernels,
grows past the sizes a reader can hold (500 and 300 lines of code: docstrings, comments and
blank lines are not counted, so that prose is never cut to fit), and no function reaches into the
private state of an object it is given (a class at the cap grows, it does not export its insides)."""

from __future__ import annotations

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

import numba_pool
from helpers import REPO

PACKAGE = Path(numba_pool.__file__).resolve().parent
#: The tools and the example kernels, beside the library in the checkout.
TOOLS, KERNELS = Path(REPO) / "tools" / "numba_pool_tools", Path(REPO) / "kernels"
#: The packages the contracts name (setup.cfg's root_packages), where they are.
ROOTS = {"numba_pool": PACKAGE, "numba_pool_tools": TOOLS, "kernels": KERNELS}
#: The most lines of code a module, and a class, may have.
MODULE_LINES, CLASS_LINES = 500, 300


def lint_imports(*package_parents: Path | str) -> subprocess.CompletedProcess:
    """import-linter's check of setup.cfg's contracts on the packages found in
    ``package_parents`` (numba_pool, numba_pool_tools, kernels), without its cache (nothing is
    written in the checkout)."""
    code = ("import sys\nfrom importlinter.cli import lint_imports\n"
            f"sys.exit(lint_imports(config_filename={str(Path(REPO) / 'setup.cfg')!r}, no_cache=True, no_logo=True))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, package_parents))}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=package_parents[0])


def test_the_import_contracts_hold():
    proc = lint_imports(*{root.parent: None for root in ROOTS.values()})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in proc.stdout, proc.stdout[-2000:]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """``plant(module, line)``: a copy of the packages (:data:`ROOTS`) with ``line`` added to
    ``module`` (a path such as ``numba_pool/plugin/api.py``); returns the folder holding the copy."""
    def plant(module: str, line: str) -> Path:
        parent = tmp_path_factory.mktemp("planted")
        for name, root in ROOTS.items():
            shutil.copytree(root, parent / name, ignore=shutil.ignore_patterns("__pycache__"))
        with open(parent / module, "a") as f:
            f.write(f"\n{line}  # planted\n")
        return parent
    return plant


LAYERS = "Layers: every module imports only the layers below its own"
ACYCLIC = "No import cycles, within any package"
RUNTIME = "What Numba's allocations run through imports neither Dask"
FRONTEND = "Only numba_pool.cuda.frontend imports a Numba CUDA frontend"
ALONE = "The library imports neither the tools nor the example kernels"
TOOLS_LAYERS = "Tools: cli over bench and snapshot, over replay"
CONTRACTS = (LAYERS, ACYCLIC, RUNTIME, FRONTEND, ALONE, TOOLS_LAYERS)


@pytest.mark.parametrize("module, line, broken, named", [
    # An upward import is a cycle too: the plugin imports the allocator.
    ("numba_pool/allocator/usage.py", "from ..plugin import api", {LAYERS, ACYCLIC},
     "numba_pool.allocator.usage -> numba_pool.plugin.api"),
    ("numba_pool/allocator/free_list.py", "from . import arena", {ACYCLIC}, "numba_pool.allocator"),
    ("numba_pool/observe/summary.py", "import matplotlib", {RUNTIME}, "numba_pool.observe.summary -> matplotlib"),
    # Even inside a function, as the tools' old `from numba import cuda` were.
    ("kernels/__init__.py", "def f():\n    from numba import cuda", {FRONTEND}, "kernels -> numba"),
    ("numba_pool/plugin/api.py", "import numba_cuda_mlir.cuda", {FRONTEND}, "numba_pool.plugin.api -> numba_cuda_mlir"),
    ("numba_pool/cli/info.py", "def f():\n    import numba_pool_tools.bench", {ALONE},
     "numba_pool.cli.info -> numba_pool_tools.bench"),
    ("numba_pool/cli/errors.py", "import kernels.sqrt", {ALONE}, "numba_pool.cli.errors -> kernels.sqrt"),
    ("numba_pool_tools/replay/run.py", "from ..bench import labels", {TOOLS_LAYERS},
     "numba_pool_tools.replay.run -> numba_pool_tools.bench.labels"),
    ("numba_pool_tools/bench/labels.py", "from ..snapshot import load", {TOOLS_LAYERS},
     "numba_pool_tools.bench.labels -> numba_pool_tools.snapshot.load"),
], ids=["upward import", "cycle", "plotting under the allocation path", "numba-cuda in a kernel", "mlir in the plugin",
        "the library importing the tools", "the library importing a kernel", "tools: replay over bench",
        "tools: bench on snapshot"])
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


def code_lines(source: str) -> set[int]:
    """The numbers of the lines of ``source`` that hold code: not blank, not only a comment, not
    part of a docstring (a string expression opening a module, class or function)."""
    lines = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                   tokenize.DEDENT, tokenize.ENDMARKER)}
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            lines -= set(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def oversized(source: str, name: str) -> list[str]:
    """What in ``source`` (the text of file ``name``) is over :data:`MODULE_LINES` or
    :data:`CLASS_LINES` lines of code (:func:`code_lines`), one line each."""
    found = []
    code = code_lines(source)
    if len(code) > MODULE_LINES:
        found.append(f"{name}: {len(code)} lines of code")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            inside = sum(node.lineno <= line <= node.end_lineno for line in code)
            if inside > CLASS_LINES:
                found.append(f"{name}: class {node.name}, {inside} lines of code")
    return found


def reach_ins(source: str, name: str) -> list[str]:
    """Where a function of ``source`` reads or calls a private attribute (``_name``, not a
    dunder) of one of its parameters other than ``self`` and ``cls``: another object's insides."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = {a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs} - {"self", "cls"}
        for inner in ast.walk(node):
            if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) \
                    and inner.value.id in params and inner.attr.startswith("_") and not inner.attr.startswith("__"):
                found.append(f"{name}:{inner.lineno}: {node.name} reads {inner.value.id}.{inner.attr}")
    return found


@pytest.mark.parametrize("root", ROOTS)
def test_no_module_or_class_is_too_long_to_read(root):
    found = []
    for path in sorted(ROOTS[root].rglob("*.py")):
        found += oversized(path.read_text(), str(path.relative_to(ROOTS[root])))
    assert found == []


def test_the_size_check_finds_a_long_class():
    body = "\n".join(f"    x{i} = {i}" for i in range(CLASS_LINES))
    assert oversized(f"class Long:\n{body}\n", "long.py") == [f"long.py: class Long, {CLASS_LINES + 1} lines of code"]
    assert oversized("x = 1\n" * (MODULE_LINES + 1), "long.py") == [f"long.py: {MODULE_LINES + 1} lines of code"]


def test_the_size_check_counts_code_not_prose():
    prose = '"""' + "words\n" * (2 * CLASS_LINES) + '"""'
    comments = "    # why\n" * (2 * CLASS_LINES)
    body = "\n".join(f"    x{i} = {i}" for i in range(CLASS_LINES - 1))
    source = f"{prose}\nclass Short:\n    {prose}\n{comments}\n{body}\n"
    assert oversized(source, "short.py") == []
    assert oversized(source + "    y = 1\n    z = 2\n", "short.py") == [f"short.py: class Short, {CLASS_LINES + 2} lines of code"]


@pytest.mark.parametrize("root", ROOTS)
def test_no_function_reaches_into_what_it_is_given(root):
    found = []
    for path in sorted(ROOTS[root].rglob("*.py")):
        found += reach_ins(path.read_text(), str(path.relative_to(ROOTS[root])))
    assert found == []


def test_the_reach_in_check_finds_one():
    source = "def layout(arena):\n    with arena._lock:\n        return arena.slabs\n" \
             "class A:\n    def own(self, other):\n        return self._x, other.__class__\n"
    assert reach_ins(source, "m.py") == ["m.py:2: layout reads arena._lock"]