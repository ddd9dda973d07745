"""Numba's pinned/mapped memory from the host cache (``NUMBA_POOL_HOST``, :mod:`numba_pool.allocator.host_blocks`)."""

from __future__ import annotations

from functools import partial

from ..allocator.block import Block
from ..allocator.host_blocks import HostBlocks, host_flags
from ..cuda.streams import LEGACY
from .state import process


def host_memory(manager, host: HostBlocks, size: int, mapped: bool, portable: bool, wc: bool):
    """``size`` bytes of page-locked host memory from ``host`` for ``manager``: a ``PinnedMemory``, or with ``mapped`` a
    ``MappedMemory``'s owned view; its release returns the block (held back inside ``defer_cleanup``).
    :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the host cache's sizes."""
    block = host.allocate_block(size, LEGACY, host_flags(mapped, portable, wc))
    finalizer = partial(_release_host, manager, block, mapped)
    history = process.recording
    if history is not None:  # numba_pool.record_history: the block and its stack, and its release
        event = history.allocated(manager.device_id, block.ptr, size, 0, "pinned", history.capture(3))  # above memhostalloc
        finalizer = partial(history.release_recorded, manager.deferral, event, finalizer)
    if not mapped:
        return manager.frontend.PooledPinnedMemory(manager.context_proxy, block.ptr, size, finalizer)
    mem = _pooled_mapped_memory(manager.frontend.driver, manager.context_proxy, block.ref, size, finalizer)
    manager.allocations[block.ptr] = mem
    return mem.own()


def _release_host(manager, block: Block, mapped: bool) -> None:
    """The finalizer of pinned/mapped memory from the host cache: drop Numba's record of a
    mapped block, then give the block back (its release gate: held back inside ``defer_cleanup``)."""
    if mapped:
        manager.allocations.pop(block.ptr, None)
    block.release(block)


def _pooled_mapped_memory(numba_driver, context, block, size: int, finalizer):
    """A cached block's ``MappedMemory``, as its constructor builds it, with the cached device pointer (a call less)."""
    from cuda.bindings import driver as binding

    mem = numba_driver.MappedMemory.__new__(numba_driver.MappedMemory)
    mem.owned = None
    mem.host_pointer = block.host
    mem._bufptr_ = block.host
    numba_driver.AutoFreePointer.__init__(mem, context, binding.CUdeviceptr(block.device), size, finalizer=finalizer)
    mem.handle = mem.host_pointer
    mem._buflen_ = mem.size
    return mem
