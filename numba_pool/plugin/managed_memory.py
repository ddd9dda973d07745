"""Numba's managed memory from the managed cache (``NUMBA_POOL_MANAGED``, :mod:`numba_pool.allocator.host_blocks` on a
:class:`~numba_pool.allocator.backings.ManagedBacking`): the managed path's block source (:mod:`.path`)."""

from __future__ import annotations

from .. import config as _config
from ..allocator.backings import ManagedBacking
from ..allocator.host_blocks import HostBlocks
from ..cuda import driver
from ..cuda.context import OwnerContext
from ..cuda.driver import warn
from ..cuda.errors import CudaAPIError
from ..cuda.mempool import concurrent_managed_access, prefetch
from ..cuda.pointers import PooledManagedMemory
from ..cuda.streams import LEGACY, per_thread, scopes_entered


class ManagedSource:
    """One manager's managed memory: ``allocate(size)``, a block from ``cache`` (host rule) on the thread's allocation
    stream in the frontend's ``PooledManagedMemory``, whose release gives it back (held back in ``defer_cleanup``).
    :param manager: the :class:`~numba_pool.plugin.manager.NumbaPoolManager`.
    :param prefetch_to: the device each new array is prefetched to (``NUMBA_POOL_MANAGED_PREFETCH``), or None."""

    def __init__(self, manager, cache: HostBlocks, prefetch_to: int | None):
        self._cache = cache
        self._context = manager.context_proxy
        self._pointer = manager.frontend.PooledManagedMemory
        self._cu = driver.cu  # the driver object the cache was made with (the model's, in tests)
        self._prefetch_to = prefetch_to

    def allocate(self, size: int) -> PooledManagedMemory:
        """``size`` (> 0) managed bytes, host-writable at once (prefetch: ``cuMemPrefetchAsync`` on its stream).
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the cache's sizes; a failed prefetch's (block freed)."""
        stream = per_thread.stream if scopes_entered else LEGACY
        if stream.scratch is not None:
            stream = stream.scratch.stream  # the scope's own stream: its scratch-carrying copy would keep the block
        if stream.value == LEGACY.value:
            stream = LEGACY
        record = self._cache.allocate_block(size, stream)
        block = record.ref
        handle = block.handle
        if handle is None:
            handle = block.handle = self._cu.CUdeviceptr(block.host)
        mem = self._pointer(self._context, handle, size, record)
        if self._prefetch_to is not None:
            try:
                prefetch(self._cu, block.host, size, self._prefetch_to, stream.handle)
            except Exception:
                mem.free()
                raise
        return mem


def managed_cache(cu, device_id: int, context, config: _config.PoolConfig,
                  deferral=None) -> tuple[HostBlocks | None, str]:
    """The managed cache of a device (blocks from ``cuMemAllocManaged``: Note [Managed blocks are not from a mempool])
    and ``""``; or None and why not (off, or no concurrent managed access), Numba's ``cuMemAllocManaged`` serving.
    ``deferral``: the manager's ``defer_cleanup`` state, holding the cache's releases back.
    :raises CudaAPIError: when the device attribute cannot be read."""
    why = why_not_served(cu, device_id, config)
    if why:
        return None, why
    cache = HostBlocks(cu, max_size=config.managed_max_size,
                       release_threshold=_config.release_limit(config.managed_release_threshold),
                       owner=OwnerContext.of(cu, context), backing=ManagedBacking(cu, device_id), deferral=deferral)
    return cache, ""


def why_not_served(cu, device_id: int, config: _config.PoolConfig, concurrent: bool | None = None) -> str:
    """Why numba_pool does not serve ``device_id``'s managed arrays, else ``""`` (:func:`managed_cache`, ``numba-pool
    info``).  :param concurrent: the device's concurrent managed access, when the caller has read it.
    :raises CudaAPIError: when the device attribute cannot be read."""
    if not config.managed:
        return "NUMBA_POOL_MANAGED is off"
    if concurrent is None:
        concurrent = concurrent_managed_access(cu, device_id)
    if not concurrent:
        return (f"device {device_id} has no concurrent managed access "
                "(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS is 0): the host must not touch managed memory "
                "while a kernel runs")
    return ""
