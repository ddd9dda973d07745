"""The Numba CUDA frontend numba_pool plugs into: the one module that imports Numba's CUDA classes.

numba_pool is a Numba External Memory Management (EMM) plugin: its manager derives from
``numba.cuda.HostOnlyCUDAMemoryManager`` and hands out ``MemoryPointer`` and ``PinnedMemory``
objects.  Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) ``numba.cuda`` has none of the
EMM classes; :mod:`numba_pool.cuda.simulator` then provides stand-ins, so that ``import
numba_pool`` and the command line keep working (see that module).  Every other module imports
these names from here, never from ``numba.cuda`` directly, so the fallback is written once.

``CudaAPIError`` comes from ``numba.cuda.cudadrv.driver``, which the simulator replaces with a
module of its own that has it.
"""

from __future__ import annotations

# Present under the simulator too: its numba.cuda.cudadrv.driver has the error class.
from numba.cuda.cudadrv.driver import CudaAPIError
# Raised by cuda.current_context() where there is no CUDA GPU (also defined under the simulator).
from numba.cuda.cudadrv.error import CudaSupportError

try:
    from numba.cuda import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryPointer
    from numba.cuda.cudadrv.driver import IpcHandle, MemoryInfo, PinnedMemory
    SIMULATOR = False
except ImportError:  # the CUDA simulator's numba.cuda has no memory managers: stand-ins
    from . import simulator

    if not simulator.enabled():
        raise
    from .simulator import HostOnlyCUDAMemoryManager, IpcHandle, MemoryInfo, MemoryPointer

    GetIpcHandleMixin = simulator.StandInMixin
    PinnedMemory = MemoryPointer
    SIMULATOR = True
    simulator.note_environment()

__all__ = ["CudaAPIError", "CudaSupportError", "GetIpcHandleMixin", "HostOnlyCUDAMemoryManager", "IpcHandle", "MemoryInfo",
           "MemoryPointer", "PinnedMemory", "SIMULATOR"]
