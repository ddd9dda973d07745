"""Packaging: what ``pip install numba-pool`` pulls in, what the wheel carries, and that the
imports of the package agree with the declared dependencies; the same for the tools beside it
(``tools/``, the numba-pool-tools distribution).  Reads setup.cfg and tools/pyproject.toml;
builds nothing."""

from __future__ import annotations

import ast
import configparser
import glob
import os
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib  # Python 3.11
except ImportError:  # Python 3.10: the tools' metadata checks skip
    tomllib = None

from helpers import REPO as CHECKOUT
from helpers import run_python

REPO = Path(CHECKOUT)
SETUP = configparser.ConfigParser()
SETUP.read(REPO / "setup.cfg")

#: import name -> distribution, for the third-party modules the package may import.
DISTRIBUTIONS = {
    "numba": "numba", "numba_cuda": "numba-cuda", "cuda": "cuda-bindings", "numpy": "numpy", "click": "click",
    "humanfriendly": "humanfriendly", "tabulate": "tabulate", "tqdm": "tqdm", "matplotlib": "matplotlib",
    "distributed": "distributed", "dask": "distributed", "torch": "torch",
}
#: Imported only where the user asks for them, never at module level: ``numba-pool-tools bench``
#: measures the anchors (RMM, CuPy, PyTorch) when they are installed, for the comparison rows only
#: (the library's own doors for CuPy and PyTorch are its extras ``cupy`` and ``torch``).
UNDECLARED_OPTIONAL = {"rmm", "cupy", "torch"}


def requirement_names(text: str) -> list[str]:
    names = []
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.append(re.split(r"[\s\[<>=!~;]", line, maxsplit=1)[0].lower())
    return names


CORE = requirement_names(SETUP["options"]["install_requires"])
EXTRAS = {name: requirement_names(text) for name, text in SETUP["options.extras_require"].items()}
#: The tools' distribution (tools/pyproject.toml): its requirements and extras.
TOOLS = tomllib.loads((REPO / "tools" / "pyproject.toml").read_text())["project"] if tomllib else None


def test_core_dependencies_are_small_and_name_no_frontend():
    # The frontends come with the extras (tests/package/test_distribution.py checks the installed
    # metadata); the numpy cap is numba-cuda's, so it goes with numba-cuda.
    assert CORE == ["numpy", "cuda-bindings", "click", "humanfriendly", "tabulate"]
    assert EXTRAS["numba-cuda"] == ["numba", "numba-cuda", "numpy"] and EXTRAS["mlir"] == ["numba-cuda-mlir"]
    assert "numba-cuda[cu13]" in SETUP["options.extras_require"]["numba-cuda"]
    assert re.search(r"numpy<2\.5", SETUP["options.extras_require"]["numba-cuda"])
    assert not re.search(r"<2\.5", SETUP["options"]["install_requires"])


def test_heavy_packages_are_extras():
    assert "plot" not in EXTRAS  # the library draws nothing: plotting is the tools' extra
    assert EXTRAS["dask"] == ["distributed"]
    # The tests import the tools from the checkout: their dependencies come with the test extra.
    assert {"pytest", "hypothesis", "distributed", "matplotlib", "tqdm"} <= set(EXTRAS["test"])


def test_the_library_has_no_tools_in_it():
    """The benchmark, the replay tool, the snapshot readers and the example kernels are beside
    the package (tools/, kernels/), not in it, and the wheel takes only numba_pool's packages."""
    for moved in ("bench", "replay", "kernels", "cli/snapshot", "cli/bench.py", "cli/replay.py"):
        assert not (REPO / "numba_pool" / moved).exists(), moved
    assert SETUP["options.packages.find"]["include"].split(", ") == ["numba_pool", "numba_pool.*"]


@pytest.mark.skipif(tomllib is None, reason="reading tools/pyproject.toml needs tomllib (Python 3.11)")
def test_the_tools_are_a_distribution_of_their_own():
    assert TOOLS["name"] == "numba-pool-tools"
    assert TOOLS["scripts"] == {"numba-pool-tools": "numba_pool_tools.cli:main"}
    assert requirement_names("\n".join(TOOLS["dependencies"])) == [
        "numba-pool", "numpy", "click", "humanfriendly", "tabulate", "tqdm"]
    assert {k: requirement_names("\n".join(v)) for k, v in TOOLS["optional-dependencies"].items()} == {
        "plot": ["matplotlib"]}


def test_driver_requirement_and_license_are_stated():
    metadata = SETUP["metadata"]
    assert "Environment :: GPU :: NVIDIA CUDA :: 13" in metadata["classifiers"]
    assert "driver >= 580" in metadata["description"]
    assert metadata["license"] == "Apache-2.0"
    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text  # the full text, not a stub
    assert "project_urls" not in metadata  # none until the project has a real address


def test_package_data_exists():
    """Every package_data pattern matches a file (a pattern matching nothing ships nothing)."""
    data = SETUP["options.package_data"]
    assert data, "package_data is empty: py.typed would not ship"
    for package, patterns in data.items():
        folder = REPO / package.replace(".", "/")
        for pattern in patterns.split():
            assert glob.glob(str(folder / pattern)), f"package_data {package} = {pattern} matches nothing"
    assert "py.typed" in data["numba_pool"].split()
    assert (REPO / "numba_pool" / "py.typed").is_file()


def third_party_imports(*folders: str) -> dict[str, tuple[str, bool]]:
    """module -> (first file importing it, whether at module level), over the shipped code of
    ``folders`` (default: the library's)."""
    stdlib = set(sys.stdlib_module_names)
    found: dict[str, tuple[str, bool]] = {}
    for folder in folders or ("numba_pool",):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            top_level = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    root = module.split(".")[0]
                    if root in stdlib or root in ("numba_pool", "numba_pool_tools", "__future__"):
                        continue
                    where, at_top = found.get(root, (str(path.relative_to(REPO)), False))
                    found[root] = (where, at_top or id(node) in top_level)
    return found


def test_every_import_is_declared():
    declared = set(CORE) | {name for names in EXTRAS.values() for name in names}
    for module, (where, _) in third_party_imports().items():
        if module in UNDECLARED_OPTIONAL:
            continue
        assert module in DISTRIBUTIONS, f"{where} imports {module}: declare it in setup.cfg and here"
        assert DISTRIBUTIONS[module] in declared, f"{where} imports {module} ({DISTRIBUTIONS[module]}), not in setup.cfg"


@pytest.mark.skipif(tomllib is None, reason="reading tools/pyproject.toml needs tomllib (Python 3.11)")
def test_every_import_of_the_tools_is_declared_and_their_extras_imported_lazily():
    declared = set(requirement_names("\n".join(TOOLS["dependencies"])))
    extras = {name for names in TOOLS["optional-dependencies"].values() for name in requirement_names("\n".join(names))}
    for module, (where, at_top) in third_party_imports("tools/numba_pool_tools").items():
        if module in UNDECLARED_OPTIONAL:
            assert not at_top, f"{where} imports {module} at module level, but it is optional"
            continue
        # cuda-bindings comes with numba-pool, which the tools require: its own dependency.
        assert DISTRIBUTIONS[module] in declared | extras | {"cuda-bindings"}, f"{where} imports {module}, undeclared"
        if DISTRIBUTIONS[module] in extras:
            assert not at_top, f"{where} imports {module} at module level, but it is an extra"


def test_extras_are_imported_lazily():
    """A package from an extra (or undeclared) is imported inside the function that needs it,
    so the core install works without it."""
    optional = {m for m, dist in DISTRIBUTIONS.items() if dist.lower() not in CORE} | UNDECLARED_OPTIONAL
    for module, (where, at_top) in third_party_imports().items():
        if module in optional:
            assert not at_top, f"{where} imports {module} at module level, but it is an optional extra"


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="imports the real numba.cuda")
def test_core_install_imports_without_the_extras():
    """``import numba_pool`` and the CLI work when matplotlib, distributed, rmm and tqdm (the
    tools') are absent, and so do the tools' command line without matplotlib."""
    code = (
        "import sys\n"
        "for name in ('matplotlib', 'distributed', 'dask', 'rmm', 'tqdm'): sys.modules[name] = None\n"
        "import numba_pool, numba_pool.cli, numba_pool.config\n"
        "import numba_pool_tools.cli\n"
        "print('ok')\n"
    )
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
