"""Everything the benchmark takes from numba_pool's allocator core, in one place: the bench's
other modules reach the core through here only (the worker's ``numba_pool.kernels`` and the
allocator part's import of a whole numba_pool package aside), so that a move of the core's
modules is one edit here.

* Numba's EMM classes (``HostOnlyCUDAMemoryManager``, ``MemoryPointer``, ``MemoryInfo``,
  ``GetIpcHandleMixin``), for the no-op floors and the CuPy anchor; under the CUDA simulator,
  whose ``numba.cuda`` has none, the core's stand-ins (:mod:`numba_pool._simulator`).
* :func:`check` (a driver call's result, or one-line error) and :func:`device_memory_info`
  (free and total bytes), for the no-op floors.
* :func:`parse_bool`, for ``NUMBA_POOL_NOOP_FINALIZER``.
* What a worker reads of a numba_pool manager: :func:`pool_handle` and :func:`has_host_cache`.
"""

from __future__ import annotations

try:
    from numba.cuda import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryPointer
    from numba.cuda.cudadrv.driver import MemoryInfo
except ImportError:  # the CUDA simulator's numba.cuda has no memory managers: stand-ins
    from .. import _simulator

    if not _simulator.enabled():
        raise
    from .._simulator import HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer

    class GetIpcHandleMixin:  # noqa: D101 - unused under the simulator
        pass

from .. import _simulator as simulator
from ..config import parse_bool
from ..mempool import check, device_memory_info

__all__ = ["GetIpcHandleMixin", "HostOnlyCUDAMemoryManager", "MemoryInfo", "MemoryPointer", "check",
           "device_memory_info", "has_host_cache", "parse_bool", "pool_handle", "simulator"]


def pool_handle(manager):
    """The driver handle (``CUmemoryPool``) of ``manager``'s pool, or ``None`` where it has none
    (another plugin, or a numba_pool manager not initialized).  numba_pool keeps its pool at
    ``manager.allocator.pool`` (``allocator`` is ``None`` before initialization); one from before
    ``numba_pool.plugin`` at ``manager._pool``."""
    allocator = getattr(manager, "allocator", None)
    pool = getattr(allocator, "pool", None) if allocator is not None else getattr(manager, "_pool", None)
    return getattr(pool, "handle", None)


def has_host_cache(manager) -> bool:
    """Whether ``manager`` serves pinned host memory from numba_pool's host cache
    (``NUMBA_POOL_HOST``: a numba_pool manager's ``_host``)."""
    return getattr(manager, "_host", None) is not None
