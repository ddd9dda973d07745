"""The numba_pool manager a door other than Numba's EMM plugin allocates through (the cuda.core memory resource,
the CuPy and PyTorch allocators): :func:`serving_manager`."""

from __future__ import annotations

from ..cuda import frontend as frontends
from .state import process


def serving_manager(device_id: int, door: str):
    """The numba_pool manager serving device ``device_id`` (an ordinal): this process's, else that of Numba's
    context for it, made current for the device first; ``door`` names the caller in messages.

    :raises RuntimeError: Numba's memory manager on the device is not numba_pool's."""
    for manager in process.managers():
        if manager.context is not None and manager.device_id == device_id:
            return manager
    cuda = frontends.resolve(door).cuda
    with cuda.gpus[device_id]:
        manager = cuda.current_context().memory_manager
    if not hasattr(manager, "allocate_block"):
        raise RuntimeError(f"{door}: Numba's memory manager on device {device_id} is {type(manager).__name__}, not "
                           "numba_pool's: set NUMBA_CUDA_MEMORY_MANAGER=numba_pool or call numba_pool.install() before "
                           "Numba's first CUDA call")
    manager.initialize()
    return manager
