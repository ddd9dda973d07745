"""The GIL check: the release path relies on the GIL (:mod:`numba_pool.allocator`, "Threads"); without it, refused."""

from __future__ import annotations

import sys

#: The one line a process without the GIL gets.
NO_GIL = ("numba_pool: this Python runs without the global interpreter lock (a free-threaded build with "
          "PYTHON_GIL=0), which numba_pool's lock-free release path relies on; run it with PYTHON_GIL=1 or on "
          "a standard build of Python")


def gil_enabled(python=sys) -> bool:
    """Whether the interpreter runs with its GIL: always on a standard build; on a free-threaded one (3.13t) unless
    ``PYTHON_GIL=0`` (``sys._is_gil_enabled()``); ``python``: the ``sys`` to ask (tests pass a stand-in)."""
    is_enabled = getattr(python, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def require_gil(python=sys) -> None:
    """:raises RuntimeError: (:data:`NO_GIL`) when the interpreter runs without its GIL."""
    if not gil_enabled(python):
        raise RuntimeError(NO_GIL)
