"""numba_pool under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``); for users: docs/guide.md, "Without a GPU".
The simulator keeps "device" arrays in host memory, with no driver or memory manager; its ``numba.cuda`` lacks the
EMM classes, whose stand-ins (refusing instantiation) :mod:`numba_pool.cuda.frontend` takes from here.  numba-cuda
ignores ``NUMBA_CUDA_MEMORY_MANAGER`` under it (only the real driver's ``_ensure_memory_manager`` imports the
module named).  ``install()`` and ``statistics()`` check, warn (:class:`SimulatorWarning`, never raised even under
``-W error``) and go on; what needs a manager raises :class:`RuntimeError`, as on a GPU without ``install()``."""

from __future__ import annotations

import os
import sys
import warnings
from collections import namedtuple

from ..config import ConfigError, load
from ..config.variables import user_stacklevel

#: Why nothing is replaced; the tail of every message given under the simulator.
NO_MEMORY_MANAGER = ("the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): it keeps device arrays in host memory "
                     "and has no memory manager for numba_pool to replace")


class SimulatorWarning(UserWarning):
    """numba_pool was asked to serve Numba's allocations while the CUDA simulator is on."""


def active() -> bool:
    """Whether the program imported ``numba.cuda`` as the CUDA simulator; imports nothing."""
    cuda = sys.modules.get("numba.cuda")
    config = getattr(cuda, "config", None)
    return bool(getattr(config, "ENABLE_CUDASIM", False))


def install_message() -> str:
    """The one line :func:`numba_pool.install` warns with under the simulator."""
    return f"numba_pool.install() does nothing: {NO_MEMORY_MANAGER}"


def warn_install() -> None:
    """Warn (:class:`SimulatorWarning`) at the user's call that ``install()`` changes nothing; never raises."""
    _note(install_message())


def warn_scope() -> None:
    """Warn (:class:`SimulatorWarning`), as :func:`warn_install`, that a statistics scope counts nothing."""
    note_nothing("numba_pool.statistics()", "counts")


def note_nothing(call: str, verb: str = "records") -> None:
    """Warn (:class:`SimulatorWarning`), as :func:`warn_install`, that ``call`` sees no allocation here."""
    _note(f"{call} {verb} nothing: {NO_MEMORY_MANAGER}")


def _note(message: str) -> None:
    """Warn at the user's line; never raise, even under an "error" filter."""
    try:
        warnings.warn(message, SimulatorWarning, stacklevel=user_stacklevel())
    except Warning:
        pass


_environment_noted = False


def requested(environ=os.environ) -> bool:
    """Whether ``NUMBA_ENABLE_CUDASIM`` is a nonzero integer, as Numba reads it (``false``: off); imports nothing."""
    try:
        return active() or int(environ.get("NUMBA_ENABLE_CUDASIM", "0")) != 0
    except ValueError:
        return False


def note_environment(environ=os.environ) -> None:
    """Warn once per process when ``NUMBA_CUDA_MEMORY_MANAGER`` names numba_pool (or ``numba_pool_tools.bench.noop``)
    under the simulator, which ignores it, and of a bad ``NUMBA_POOL_*`` value.  Never raises."""
    global _environment_noted
    value = environ.get("NUMBA_CUDA_MEMORY_MANAGER", "").strip()
    if _environment_noted or not (value == "numba_pool" or value.startswith(("numba_pool.", "numba_pool_tools."))):
        return
    _environment_noted = True
    _note(f"NUMBA_CUDA_MEMORY_MANAGER={value} is ignored: {NO_MEMORY_MANAGER}")
    try:  # the variables are still checked: a bad value is told now, not on the first GPU
        load(environ)
    except ConfigError as err:
        _note(str(err))


NO_GPU = f"no CUDA GPU here: {NO_MEMORY_MANAGER}"  #: The CLI's line (exit status 2) for a GPU command here.


class _StandIn:
    """Base of the stand-ins numba_pool's classes derive from under the simulator: making one raises RuntimeError."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"numba_pool: {type(self).__name__} cannot be used: {NO_MEMORY_MANAGER}")


class HostOnlyCUDAMemoryManager(_StandIn):
    """Stand-in for ``numba.cuda.HostOnlyCUDAMemoryManager``, absent under the simulator."""


class MemoryPointer(_StandIn):
    """Stand-in for ``numba.cuda.MemoryPointer``, absent under the simulator."""


class IpcHandle(_StandIn):
    """Stand-in for ``numba.cuda.cudadrv.driver.IpcHandle``, absent under the simulator."""


class StandInMixin:
    """Stand-in for ``numba.cuda.GetIpcHandleMixin``, absent under the simulator (adds nothing)."""


MemoryInfo = namedtuple("MemoryInfo", "free,total")  #: Stand-in for ``cudadrv.driver.MemoryInfo`` (free, total bytes).
