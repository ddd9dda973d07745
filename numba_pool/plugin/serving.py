"""What the doors other than Numba's EMM plugin share (the cuda.core memory resource, the CuPy and PyTorch
allocators): the manager they allocate through (:func:`serving_manager`), and their allocations in the history
(:func:`recorded`, :func:`release`), tagged with the door's name as their kind (``cuda.core``, ``cupy``,
``torch``), so that snapshots and the leak report show them beside Numba's."""

from __future__ import annotations

import weakref
from typing import Callable

from ..cuda import frontend as frontends
from .state import process


def serving_manager(device_id: int, door: str):
    """The numba_pool manager serving device ``device_id`` (an ordinal): the one the doors used last while it
    lives (a weak reference: Numba dropping its context lets it go), else this process's, else that of
    Numba's context for it, made current for the device first; ``door`` names the caller in messages.

    :raises RuntimeError: Numba's memory manager on the device is not numba_pool's."""
    ref = process.door_managers.get(device_id)
    manager = ref() if ref is not None else None
    if manager is not None and manager.context is not None:
        return manager
    manager = _find(device_id, door)
    process.door_managers[device_id] = weakref.ref(manager)
    return manager


def _find(device_id: int, door: str):
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


def recorded(manager, block, door: str):
    """``(history, event)`` of ``block``'s allocation through ``door`` while :func:`numba_pool.record_history`
    records (its stack from the door's caller), else None: one attribute load when off."""
    history = process.recording
    if history is None:
        return None
    frames = history.capture(3)  # above capture, recorded and the door's allocate: from its caller
    return history, history.allocated(manager.device_id, block.address, block.size, block.stream.value, door, frames)


def release(record, deallocate: Callable[[], None]) -> None:
    """Run ``deallocate`` (the block's release), recording its ``free`` when its allocation was recorded.
    Never raises (a finalizer)."""
    if record is None:
        deallocate()
        return
    history, event = record
    history.release_recorded(None, event, deallocate)
