"""Example kernels (from CUDA's memory-pool tutorials) as Numba CUDA kernels, each also a
small script run from a checkout: ``python kernels/sqrt.py`` (or ``python -m kernels.sqrt`` from
its top level).  Beside the library, not in it: the ``numba_pool`` package never imports them
(setup.cfg's import contracts); the tests import them as ``kernels`` (pytest's ``pythonpath``).

Every script is plain Numba: run it with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` to use the
plugin, without it for Numba's default manager; ``--frontend numba-cuda|mlir`` picks the Numba
CUDA frontend (default: ``NUMBA_POOL_FRONTEND``, else the one installed, numba-cuda first).

Note [A kernel for each frontend]
    A kernel is a :class:`Kernel`: a Python function compiled by each frontend's ``cuda.jit``
    at its first use there (:meth:`Kernel.for_frontend`, once per frontend), so that importing
    a kernel imports no frontend.  The function's ``cuda`` is a global of its module, ``None``
    there: each frontend compiles a copy of the function whose globals have that frontend's
    ``cuda`` module instead.  A global, not a closure variable: numba-cuda's CUDA simulator runs
    a kernel by swapping the ``numba.cuda`` it finds among the function's globals.
    ``kernel[blocks, threads](...)`` and the dispatcher's attributes (``kernel.py_func`` ...)
    are those of the tools' frontend (:func:`numba_pool.cuda.frontend.for_tools`).
"""

from __future__ import annotations

import importlib
import threading
import types
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # numba_pool is imported at the first use, not here: a script first sets up how it warns
    from numba_pool.cuda.frontend import Frontend

# kernel -> module; distinct names, so that a kernel is never shadowed by its module.
_KERNELS = {"fill_kernel": "fill", "increment_kernel": "increment", "sqrt_kernel": "sqrt"}
__all__ = [*_KERNELS, "Kernel", "frontend_of"]


def frontend_of(frontend: str | Frontend | None = None) -> Frontend:
    """The frontend meant by ``frontend``: a :class:`~numba_pool.cuda.frontend.Frontend`, a
    name (``"numba-cuda"``, ``"mlir"``), or None for the tools' choice
    (:func:`~numba_pool.cuda.frontend.for_tools`); loaded (imported) now.

    :raises FrontendError: for a name that is no frontend, or one not installed.
    """
    from numba_pool.cuda import frontend as frontends

    return frontends.named(frontend, "kernels: frontend")


class Kernel:
    """A kernel, compiled by each frontend's ``cuda.jit`` at its first use there (Note [A kernel
    for each frontend]).

    :param function: the kernel as a Python function whose ``cuda`` is a global of its module.
    """

    def __init__(self, function: Callable):
        self.function = function
        self.__name__ = self.__qualname__ = function.__name__
        self.__doc__ = function.__doc__
        self.__module__ = function.__module__
        self._lock = threading.Lock()
        self._compiled: dict[str, Any] = {}  # frontend name -> its dispatcher; guarded by _lock

    def for_frontend(self, frontend: str | Frontend | None = None):
        """The kernel compiled by ``frontend``'s ``cuda.jit`` (a ``Frontend``, a name, or None
        for the tools' frontend): the same dispatcher at every call for one frontend.

        :raises FrontendError: for a name that is no frontend, or one not installed.
        """
        chosen = frontend_of(frontend)
        with self._lock:
            compiled = self._compiled.get(chosen.name)
            if compiled is None:
                compiled = self._compiled[chosen.name] = chosen.cuda.jit(self.python_function(chosen))
            return compiled

    def python_function(self, frontend: Frontend) -> Callable:
        """A copy of the Python function whose ``cuda`` is ``frontend``'s (what its ``cuda.jit``
        compiles; a bench compiles it again with options of its own)."""
        function = self.function
        # Its __name__ stays the code's: Numba-CUDA-MLIR finds the function again by name when
        # it recompiles it from the source.
        rebound = types.FunctionType(function.__code__, {**function.__globals__, "cuda": frontend.cuda},
                                     function.__name__, function.__defaults__, function.__closure__)
        rebound.__qualname__, rebound.__doc__ = function.__qualname__, function.__doc__
        rebound.__kwdefaults__, rebound.__annotations__ = function.__kwdefaults__, dict(function.__annotations__)
        return rebound

    def __getitem__(self, configuration):
        """``kernel[blocks, threads]`` or ``kernel[blocks, threads, stream]``: the launch on the
        tools' frontend."""
        return self.for_frontend()[configuration]

    def __getattr__(self, name: str):
        if name.startswith("_"):  # not forwarded: copy, pickle and half-built instances ask for these
            raise AttributeError(name)
        return getattr(self.for_frontend(), name)

    def __repr__(self) -> str:
        return f"<kernel {self.__module__}.{self.__name__}, compiled for {sorted(self._compiled) or 'none yet'}>"


def __getattr__(name):
    # Imported on first use, so that `python -m kernels.sqrt` does not find its own
    # module already imported by the package (runpy warns about that).
    if name in _KERNELS:
        return getattr(importlib.import_module(f".{_KERNELS[name]}", __name__), name)
    raise AttributeError(name)
