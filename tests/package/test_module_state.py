"""Module-level state (issue 34): numba_pool's process state lives in one object
(``numba_pool.plugin.state.process``); a module may hold mutable state of its own only as a
latch or memo listed in docs/architecture.md, "Module-level state".  The check reads every
module's syntax tree: a module-level binding to a mutable literal or to a call (an instance:
locks, registries, queues), a name rebound through ``global``, and a module's attribute set
from another module.  Each such name must be in :data:`LATCHES` (which the docs table mirrors
exactly) or in :data:`CONSTANTS` (tables of a mutable type that nothing mutates, which the check
also verifies).  The check fails on a planted global of each kind."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

import numba_pool
from helpers import REPO

PACKAGE = Path(numba_pool.__file__).resolve().parent
#: Subpackages moving out of the package (tools, not the library): not checked.
SKIPPED = ("bench", "replay", "kernels", "cli")

#: Calls whose result is immutable (or a class): not state.
IMMUTABLE_CALLS = {"frozenset", "tuple", "int", "str", "float", "bytes", "bool", "namedtuple", "re.compile"}
MUTABLE_LITERALS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
#: Methods that mutate a list, dict, set or deque.
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard", "setdefault",
            "popitem", "appendleft", "popleft", "sort", "reverse"}

#: The process-state object and the latches, (module, name): docs/architecture.md's table
#: "Module-level state", row for row.
LATCHES = {
    ("numba_pool.plugin.state", "process"),
    ("numba_pool.cuda.streams", "per_thread"),
    ("numba_pool.cuda.streams", "scopes_entered"),
    ("numba_pool.observe.scopes", "_local"),
    ("numba_pool.allocator.captures", "underway"),
    ("numba_pool.allocator.captures", "_deferred"),
    ("numba_pool.allocator.captures", "_lock"),
    ("numba_pool.cuda.driver", "cu"),
    ("numba_pool.cuda.driver", "_twins"),
    ("numba_pool.cuda.errors", "_lock"),
    ("numba_pool.cuda.errors", "_bases"),
    ("numba_pool.cuda.errors", "_raised"),
    ("numba_pool.cuda.frontend", "_lock"),
    ("numba_pool.cuda.frontend", "_loaded"),
    ("numba_pool.cuda.frontend", "_serving"),
    ("numba_pool.cuda.simulator", "_environment_noted"),
    ("numba_pool.ipc.export", "_export_ids"),
    ("numba_pool.ipc.handle", "_imported"),
    ("numba_pool.ipc.handle", "_handle_classes"),
    ("numba_pool.observe.history", "_SKIP"),
    ("numba_pool.observe.history", "_line_tables"),
}

#: Bindings of a mutable type that are constants: no function assigns into them or calls a
#: mutating method on them (:func:`test_the_constants_are_never_mutated`).
CONSTANTS = {
    ("numba_pool", "__all__"),
    ("numba_pool.ipc", "__all__"),
    ("numba_pool.config", "__all__"),
    ("numba_pool.config", "OPTIONS"),
    ("numba_pool.config", "SWITCHED"),
    ("numba_pool.config.sizes", "_UNITS"),
    ("numba_pool.config.sizes", "_UNIT_NAMES"),
    ("numba_pool.config.values", "_TRUE"),
    ("numba_pool.config.values", "_FALSE"),
    ("numba_pool.config.variables", "OTHER_VARIABLES"),
    ("numba_pool.config.variables", "RETIRED"),
    ("numba_pool.plugin.torch_allocator", "_MALLOC"),  # ctypes function types
    ("numba_pool.plugin.torch_allocator", "_FREE"),
    ("numba_pool.cuda.frontend", "TITLES"),
    ("numba_pool.cuda.frontend", "PACKAGES"),
    ("numba_pool.cuda.frontend", "_DRIVERS"),
    ("numba_pool.cuda.frontend", "_TOP_LEVEL"),
    ("numba_pool.cuda.frontend", "DISTRIBUTIONS"),
    ("numba_pool.cuda.frontend", "EXTRAS"),
    ("numba_pool.cuda.frontend", "_SPELLINGS"),
    ("numba_pool.cuda.streams", "LEGACY"),  # a StreamRef whose key is set at construction
    ("numba_pool.observe.scopes", "_DISCARD"),  # an instance without slots
    ("numba_pool.observe.snapshot", "STATES"),
    ("numba_pool.integrations.dask", "logger"),  # logging's, configured by the program
}


def module_name(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path) -> dict[str, ast.Module]:
    """Every checked module of the package in ``package``: name -> syntax tree."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] in SKIPPED:
            continue
        found[module_name(package, path)] = ast.parse(path.read_text(), str(path))
    return found


def _top_level(body: list) -> list:
    """A module's statements, those under a module-level ``if``, ``try`` or ``with`` too."""
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody"):
                out += _top_level(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                out += _top_level(handler.body)
    return out


def _is_mutable(value: ast.expr) -> bool:
    if isinstance(value, MUTABLE_LITERALS):
        return True
    return isinstance(value, ast.Call) and ast.unparse(value.func) not in IMMUTABLE_CALLS


def _module_aliases(package: Path, module: str, tree: ast.Module) -> dict[str, str]:
    """Local name -> numba_pool module, for the names ``tree`` binds to a module of the package."""
    is_package = (package.parent / Path(*module.split("."))).is_dir()
    here = module.split(".") if is_package else module.split(".")[:-1]
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("numba_pool") and alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            prefix = base + (node.module.split(".") if node.module else [])
            for alias in node.names:
                target = prefix + [alias.name]
                path = package.parent / Path(*target)
                if target[0] == "numba_pool" and (path.is_dir() or path.with_suffix(".py").is_file()):
                    aliases[alias.asname or alias.name] = ".".join(target)
    return aliases


def module_state(package: Path) -> dict[tuple[str, str], str]:
    """(module, name) -> how it was found, for every module-level mutable binding, name
    rebound through ``global`` and module attribute set from another module."""
    found = {}
    trees = modules(package)
    for module, tree in trees.items():
        for node in _top_level(tree.body):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            elif isinstance(node, ast.AugAssign):
                targets, value = [node.target], ast.List()
            else:
                continue
            if _is_mutable(value):
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            found[(module, name.id)] = f"line {node.lineno}: {ast.unparse(node)[:80]}"
        aliases = _module_aliases(package, module, tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                for name in node.names:
                    found[(module, name)] = f"line {node.lineno}: global {name}"
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id in aliases:
                    found[(aliases[target.value.id], target.attr)] = f"{module} line {node.lineno}: {ast.unparse(node)}"
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases:
                found[(aliases[node.args[0].id], "<setattr>")] = f"{module} line {node.lineno}: {ast.unparse(node)}"
    return found


def unlisted(package: Path) -> dict[tuple[str, str], str]:
    """What :func:`module_state` finds in ``package`` that neither list allows."""
    return {key: how for key, how in module_state(package).items() if key not in LATCHES | CONSTANTS}


def test_no_module_state_outside_the_latches_and_the_process_state():
    assert unlisted(PACKAGE) == {}, "module-level state outside the latches of docs/architecture.md"


def test_every_listed_latch_and_constant_still_exists():
    found = module_state(PACKAGE)
    stale = sorted(key for key in LATCHES | CONSTANTS if key not in found)
    assert stale == [], "listed but gone: drop them from the lists (and the docs table)"


def docs_table() -> set[tuple[str, str]]:
    """(module, name) of each row of docs/architecture.md's table "Module-level state"."""
    text = (Path(REPO) / "docs" / "architecture.md").read_text()
    section = text.split("## Module-level state", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        module = cells[0].strip("`")
        rows |= {(module, name) for name in re.findall(r"`([^`]+)`", cells[1])}
    return rows


def test_the_docs_table_lists_exactly_the_latches():
    assert docs_table() == LATCHES


def test_the_constants_are_never_mutated():
    trees = modules(PACKAGE)
    for module, name in CONSTANTS:
        # Filled at import (a module-level loop) is construction; inside a function, mutation.
        functions = [f for f in ast.walk(trees[module]) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in (node for f in functions for node in ast.walk(f)):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for target in getattr(node, "targets", None) or [node.target]:
                    assert not (isinstance(target, ast.Subscript) and ast.unparse(target.value) == name), \
                        f"{module}.{name} is assigned into at line {node.lineno}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func.value) == name:
                assert node.func.attr not in MUTATORS, f"{module}.{name}.{node.func.attr}() at line {node.lineno}"


@pytest.mark.parametrize(("module", "line", "caught"), [
    ("plugin/api.py", "_cache = {}", ("numba_pool.plugin.api", "_cache")),
    ("observe/history.py", "_waiting = collections.deque()", ("numba_pool.observe.history", "_waiting")),
    ("cuda/streams.py", "def _flip():\n    global _flag\n    _flag = True", ("numba_pool.cuda.streams", "_flag")),
    ("plugin/api.py", "from ..cuda import streams as _s\n\n\ndef _patch():\n    _s.hook = print",
     ("numba_pool.cuda.streams", "hook")),
    ("observe/scopes.py", "_open = 0\n_open += 1", ("numba_pool.observe.scopes", "_open")),
], ids=["dict", "instance", "global", "set-from-elsewhere", "augmented"])
def test_the_check_fails_on_a_planted_global(tmp_path, module, line, caught):
    shutil.copytree(PACKAGE, tmp_path / "numba_pool", ignore=shutil.ignore_patterns("__pycache__", *SKIPPED))
    with open(tmp_path / "numba_pool" / module, "a") as f:
        f.write(f"\n\n{line}  # planted\n")
    assert list(unlisted(tmp_path / "numba_pool")) == [caught]
