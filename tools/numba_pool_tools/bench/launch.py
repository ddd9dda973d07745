"""Running a bench module in a fresh Python process, from the parent: its command line and
environment (with the parent's frontend, ``NUMBA_POOL_FRONTEND``), and the JSON line it prints
last.

Numba binds the memory manager when it creates a context, so each end-to-end worker
(``python -m numba_pool_tools.bench``) and each allocator run (``python -m
numba_pool_tools.bench.allocator_cost``) is a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba_pool

from .core import FRONTEND, NUMBA_CUDA, worker_environment
from .timing import CORE_VARIABLE, REPEATS_VARIABLE
from .turns import TURNS_VARIABLE, pinned_thread

#: The folder holding the numba_pool_tools we are (numba_pool_tools/bench/ is two levels below
#: it), where the workers start, and the folder holding the numba_pool we use.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUMBA_POOL_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(numba_pool.__file__)))
#: The bench's package (``python -m WORKER_PACKAGE``: the end-to-end worker), and a baseline's
#: from before the tools moved out of numba_pool (:func:`worker_package`).
WORKER_PACKAGE = "numba_pool_tools.bench"
OLD_WORKER_PACKAGE = "numba_pool.bench"


def worker_package(folder: str | None) -> str:
    """The bench package whose workers run for the numba_pool in ``folder`` (a ``--baseline``;
    None: ours): a numba_pool from before the tools moved out of it carries its own
    :data:`OLD_WORKER_PACKAGE`, which knows it; any other runs ours on it."""
    if folder and os.path.isdir(os.path.join(folder, *OLD_WORKER_PACKAGE.split("."))):
        return OLD_WORKER_PACKAGE
    return WORKER_PACKAGE


def run_module(module: str, args: list[str], env: dict | None = None, cwd: str | None = None) -> dict:
    """Run ``python -m module args`` in a fresh process and parse the JSON line it prints last.

    :raises RuntimeError: when it fails, with its exit status and standard error.
    """
    argv, env, cwd = command(module, args, env or {}, cwd)
    core = env.get(CORE_VARIABLE, "").strip()
    # Pinned from its first instruction, not only once it times: the memory it allocates while
    # it imports and creates its context is then placed for the core it is timed on.
    with pinned_thread(int(core) if core else None):
        proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    return last_json(proc.returncode, proc.stdout, proc.stderr)


def command(module: str, args: list[str], env: dict, cwd: str | None) -> tuple[list[str], dict, str]:
    """``(argv, env, cwd)`` of ``python -m module args``: this process's variables with ``env``
    over them, less :data:`REPEATS_VARIABLE` (only warm-up rounds set it, through ``env``) and
    the turns' pipes (only :func:`numba_pool_tools.bench.turns.run_in_turns` gives them), and
    ``NUMBA_POOL_FRONTEND`` naming this process's frontend over all
    (:func:`numba_pool_tools.bench.core.worker_environment`: every process of the bench runs under the
    same one); started in ``cwd``, else in :data:`PACKAGE_PARENT`, with :data:`PACKAGE_PARENT` and
    :data:`NUMBA_POOL_PARENT` first on ``PYTHONPATH``."""
    inherited = {k: v for k, v in os.environ.items() if k != REPEATS_VARIABLE}
    env = {**inherited, **env, **worker_environment(), "PYTHONUNBUFFERED": "1"}
    env.pop(TURNS_VARIABLE, None)
    # The worker imports the numba_pool_tools and the numba_pool we are, not a source checkout in
    # the current directory; a baseline's folder (cwd) comes first on its sys.path, before these.
    paths = [PACKAGE_PARENT, NUMBA_POOL_PARENT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return [sys.executable, "-m", module, *args], env, cwd or PACKAGE_PARENT


def same_frontend(result: dict) -> dict:
    """``result``, a bench process's JSON object, where it ran under this process's frontend: its
    ``frontend``; a numba_pool from before the frontends (as a ``--baseline`` may be) does not say,
    and ran under numba-cuda, the only one it knows.

    :raises RuntimeError: naming both frontends, where it ran under another.
    """
    ran = result.get("frontend", NUMBA_CUDA)
    if ran != FRONTEND.name:
        before = "" if "frontend" in result else ": a numba_pool from before the frontends (as a --baseline may be)"
        raise RuntimeError(f"it ran under the {ran} frontend, not {FRONTEND.name} as asked (NUMBA_POOL_FRONTEND)"
                           + before)
    return result


def last_json(status: int, stdout: str, stderr: str) -> dict:
    """The JSON line a process printed last.

    :raises RuntimeError: when it exited with a non-zero ``status`` or printed nothing, with the
        end of its standard error.
    """
    lines = stdout.strip().splitlines()
    if status != 0 or not lines:
        raise RuntimeError(f"exit {status}:\n{stderr.strip()[-3000:]}")
    return json.loads(lines[-1])
