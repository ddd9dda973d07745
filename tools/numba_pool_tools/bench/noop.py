"""No-op EMM plugins: the floors of ``numba-pool-tools bench``.

Every ``memalloc`` returns the same preallocated buffer in a ``MemoryPointer``.  Useless (every
array aliases one buffer) except for measuring.  Two floors:

* :class:`NoopManager` gives each pointer a finalizer that does nothing: Numba's own overhead per
  device array plus the ``weakref.finalize`` that Numba wraps around the finalizer of every EMM
  plugin that passes one (RMM's and CuPy's do).  Select it with
  ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool_tools.bench.noop``.
* :class:`BareNoopManager` passes no finalizer: Numba's own overhead alone, the least any
  plugin can cost.  Select it with ``NUMBA_POOL_NOOP_FINALIZER=0`` as well.

Both derive from the EMM classes of the bench's frontend (:data:`numba_pool_tools.bench.core.FRONTEND`,
``NUMBA_POOL_FRONTEND``), which reads :data:`_numba_memory_manager` when it creates a context.
"""

from __future__ import annotations

import os

from cuda.bindings import driver as cu

from .core import (SIMULATOR, HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer, check, device_memory_info,
                   parse_bool, simulator)

if SIMULATOR:  # numba-cuda ignores NUMBA_CUDA_MEMORY_MANAGER under the simulator: say so, once
    simulator.note_environment()

BUFFER_BYTES = 64 << 20


def _nothing() -> None:
    pass


class NoopManager(HostOnlyCUDAMemoryManager):
    """Hands out one ``cuMemAlloc`` buffer of :data:`BUFFER_BYTES` (grown when a request is
    larger) to every allocation and never frees it until ``reset``."""

    #: Given to every pointer; Numba wraps it in ``weakref.finalize``.
    finalizer = staticmethod(_nothing)

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
        return MemoryPointer(self.context, self._buffer, size, finalizer=self.finalizer)

    def get_memory_info(self) -> MemoryInfo:
        free, total = device_memory_info()
        return MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        raise NotImplementedError("numba_pool_tools.bench.noop does not support IPC")

    def reset(self) -> None:
        super().reset()
        if self._buffer is not None:
            cu.cuMemFree(self._buffer)
            self._buffer = None
            self._buffer_bytes = 0


class BareNoopManager(NoopManager):
    """:class:`NoopManager` without a finalizer: Numba's cost per device array alone."""

    finalizer = None


def chosen_manager(environ=os.environ) -> type:
    """:class:`NoopManager`, or :class:`BareNoopManager` when ``NUMBA_POOL_NOOP_FINALIZER`` is
    false.

    :raises ConfigError: for a value that is not a boolean, naming the variable and its value.
    """
    value = environ.get("NUMBA_POOL_NOOP_FINALIZER", "").strip()
    with_finalizer = parse_bool(value, "NUMBA_POOL_NOOP_FINALIZER") if value else True
    return NoopManager if with_finalizer else BareNoopManager


_numba_memory_manager = chosen_manager()
