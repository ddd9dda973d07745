"""The ``NUMBA_POOL_*`` variables: which are known, a probable typo's warning and where it points (the user's line)."""

from __future__ import annotations

import difflib
import os
import sys
import sysconfig
import warnings
from typing import Callable, Iterable, Mapping

from .errors import ConfigWarning

PREFIX = "NUMBA_POOL_"
#: The tools' frontend and the tie-breaker of a process using both (:mod:`numba_pool.cuda.frontend`; no pool option).
FRONTEND_VARIABLE = "NUMBA_POOL_FRONTEND"

#: Variables of numba_pool's bench and test tools, not read by :func:`numba_pool.config.load`: never warned about.
OTHER_VARIABLES = {
    "NUMBA_POOL_NOOP_FINALIZER": "numba_pool_tools.bench.noop: the no-op manager keeps (1) or drops (0) its finalizer",
    "NUMBA_POOL_BENCH_RMM": "set by numba-pool-tools bench in the child process that measures rmm",
    "NUMBA_POOL_BENCH_CORE": "set by numba-pool-tools bench: the CPU core its end-to-end workers pin themselves to",
    "NUMBA_POOL_BENCH_TURNS": "set by numba-pool-tools bench: the pipes its end-to-end workers take turns through",
    "NUMBA_POOL_BENCH_REPEATS": "set by numba-pool-tools bench in its warm-up rounds' workers: timed repeats per figure",
    "NUMBA_POOL_FUZZ_EXAMPLES": "tests/allocator/test_fuzz.py: number of hypothesis examples",
    "NUMBA_POOL_FUZZ_PARK": "tests/allocator/test_fuzz.py: 0 leaves out the park rule (another thread's launch-and-drop between two driver calls)",
    "NUMBA_POOL_FUZZ_RULES": "tests/allocator/test_fuzz.py: only these rules, comma-separated (a run looking for one class of defect)",
    "NUMBA_POOL_FUZZ_CAPTURE_BARE": "tests/allocator/test_fuzz.py: 0 leaves out drops from a thread with no CUDA context during a capture",
}


def _squeezed(name: str) -> str:
    """``name`` upper-cased without underscores (``Numba_Pool_Arena``, ``NUMBAPOOL_ARENA`` -> ``NUMBAPOOLARENA``)."""
    return name.upper().replace("_", "")


#: Variables numba_pool no longer reads, and why: a warning says so instead of suggesting a neighbour.
RETIRED = {"NUMBA_POOL_MANAGED_INITIAL_SIZE": "managed blocks come from cuMemAllocManaged, which reserves nothing "
                                           "ahead (numba_pool 2026-11-27)"}


def probable_typo(name: str, options: Iterable[str]) -> str | None:
    """The warning for ``name`` if it looks meant for numba_pool (``NUMBA_POOL_`` in any case, ``NUMBAPOOL`` squeezed)
    but is none of its variables, else None; it suggests the closest (else of :data:`OTHER_VARIABLES`) or lists them."""
    if not _squeezed(name).startswith("NUMBAPOOL") or name in OTHER_VARIABLES:
        return None
    if name in RETIRED:
        return f"{name} is no longer read and is ignored: {RETIRED[name]}"
    options = sorted(options)
    if name in options:
        return None
    tail = _squeezed(name)[len("NUMBAPOOL"):]  # Compared without the shared prefix (all names would look close).
    close = _closest(tail, options) or _closest(tail, OTHER_VARIABLES)
    hint = f"did you mean {close}?" if close else f"known variables: {', '.join(options)}"
    return f"{name} is not a numba_pool variable and is ignored: {hint}"


def _closest(tail: str, names: Iterable[str]) -> str | None:
    tails = {_squeezed(name)[len("NUMBAPOOL"):]: name for name in names}
    close = difflib.get_close_matches(tail, list(tails), n=1)
    return tails[close[0]] if close else None


def warn_unknown_variables(environ: Mapping[str, str], options: Iterable[str]) -> None:
    """Warn (:class:`ConfigWarning`) at the user's line for each ``environ`` variable :func:`probable_typo` reports."""
    options = list(options)
    for name in sorted(environ):
        message = probable_typo(name, options)
        if message:
            warnings.warn(message, ConfigWarning, stacklevel=user_stacklevel())


def _between_frames() -> Callable[[str], bool]:
    """Whether a file's frames lie between the user's line and a warning given as Numba initializes the plugin:
    numba_pool's, the loaded Numba packages', the standard library's (``contextlib``, ``functools``), but not the
    installed packages' (``site-packages``, inside the standard library's folder without a virtual environment)."""
    paths = sysconfig.get_paths()
    folders = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # numba_pool/
    for name in ("numba", "numba_cuda", "numba_cuda_mlir"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            folders.append(os.path.dirname(os.path.abspath(path)))
    packages = tuple(folder + os.sep for folder in folders)
    stdlib = os.path.abspath(paths["stdlib"]) + os.sep
    installed = tuple({os.path.abspath(paths[key]) + os.sep for key in ("purelib", "platlib")})
    return lambda path: path.startswith(packages) or (path.startswith(stdlib) and not path.startswith(installed))


def user_stacklevel() -> int:
    """The ``stacklevel`` pointing its caller's ``warnings.warn`` at the first frame outside numba_pool, Numba and the
    stdlib (``contextlib`` lies between Numba's context creation and the user): the user's ``install()``, ``import
    numba_pool`` or first CUDA call; importlib's bootstrap frames skipped, as by ``warnings.warn``."""
    between = _between_frames()
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            if not between(os.path.abspath(name)):
                return level
            level += 1
        frame = frame.f_back
    return max(1, level - 1)
