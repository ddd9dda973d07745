"""A no-op EMM plugin: the floor of ``numba-pool bench``.

Every ``memalloc`` returns the same preallocated buffer in a ``MemoryPointer`` with a finalizer
that does nothing: what remains is Numba's own overhead per device array plus what every
allocator pays for a finalizer.  Useless (every array aliases one buffer) except for measuring.
Select it with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool.noop``.
"""

from __future__ import annotations

from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer
from numba.cuda.cudadrv.driver import MemoryInfo

from cuda.bindings import driver as cu

from .mempool import check, device_memory_info

BUFFER_BYTES = 64 << 20


def _nothing() -> None:
    pass


class NoopManager(HostOnlyCUDAMemoryManager):
    """Hands out one ``cuMemAlloc`` buffer of :data:`BUFFER_BYTES` (grown when a request is
    larger) to every allocation and never frees it until ``reset``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._buffer = None
        self._buffer_bytes = 0

    @property
    def interface_version(self) -> int:
        return 1

    def initialize(self) -> None:
        if self._buffer is None:
            self._grow(BUFFER_BYTES)

    def _grow(self, nbytes: int) -> None:
        if self._buffer is not None:
            check(cu.cuMemFree(self._buffer), "cuMemFree")
        self._buffer = check(cu.cuMemAlloc(nbytes), "cuMemAlloc")
        self._buffer_bytes = nbytes

    def memalloc(self, size: int) -> MemoryPointer:
        if size > self._buffer_bytes:
            self._grow(size)
        return MemoryPointer(self.context, self._buffer, size, finalizer=_nothing)

    def get_memory_info(self) -> MemoryInfo:
        free, total = device_memory_info()
        return MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        raise NotImplementedError("numba_pool.noop does not support IPC")

    def reset(self) -> None:
        super().reset()
        if self._buffer is not None:
            cu.cuMemFree(self._buffer)
            self._buffer = None
            self._buffer_bytes = 0


_numba_memory_manager = NoopManager
