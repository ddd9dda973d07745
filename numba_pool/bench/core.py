"""Everything the benchmark takes from numba_pool's allocator core, in one place: the bench's
other modules reach the core through here only (the worker's ``numba_pool.kernels`` and the
allocator part's import of a whole numba_pool package aside).

* Numba's EMM classes (``HostOnlyCUDAMemoryManager``, ``MemoryPointer``, ``MemoryInfo``,
  ``GetIpcHandleMixin``), for the no-op floors and the CuPy anchor, from
  :mod:`numba_pool.cuda.frontend` (the simulator's stand-ins under the CUDA simulator).
* :func:`check` (a driver call's result, or one-line error) and :func:`device_memory_info`
  (free and total bytes), for the no-op floors.
* :func:`parse_bool`, for ``NUMBA_POOL_NOOP_FINALIZER``.
* What a worker reads of a numba_pool manager: :func:`pool_handle` and :func:`has_host_cache`.
"""

from __future__ import annotations

from ..config import parse_bool
from ..cuda import simulator
from ..cuda.driver import check
from ..cuda.frontend import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer
from ..cuda.mempool import device_memory_info

__all__ = ["GetIpcHandleMixin", "HostOnlyCUDAMemoryManager", "MemoryInfo", "MemoryPointer", "check",
           "device_memory_info", "has_host_cache", "parse_bool", "pool_handle", "simulator"]


def pool_handle(manager):
    """The driver handle (``CUmemoryPool``) of ``manager``'s pool, or ``None`` where it has none
    (another plugin, or a numba_pool manager not initialized: its ``allocator`` is ``None``)."""
    pool = getattr(getattr(manager, "allocator", None), "pool", None)
    return getattr(pool, "handle", None)


def has_host_cache(manager) -> bool:
    """Whether ``manager`` serves pinned host memory from numba_pool's host cache
    (``NUMBA_POOL_HOST``: a numba_pool manager's ``host``)."""
    return getattr(manager, "host", None) is not None
