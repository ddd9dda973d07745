"""Where the blocks of a host-rule cache (:class:`~.host_blocks.HostBlocks`) come from and go back: the two
kinds of memory whose next owner may be the CPU (rule 9 of :mod:`numba_pool.allocator`).  A backing knows
nothing of events or reuse: the cache decides when a block may go back.

* :class:`PinnedBacking`: page-locked host memory, ``cuMemHostAlloc`` / ``cuMemFreeHost``
  (``NUMBA_POOL_HOST``), mapped into the device's address space on request.
* :class:`ManagedBacking`: managed (unified) memory from a managed mempool (``CU_MEM_ALLOCATION_TYPE_MANAGED``,
  ``NUMBA_POOL_MANAGED``).  The driver refuses ``CUmemPoolProps.maxSize`` on managed pools
  (``CUDA_ERROR_INVALID_VALUE``, H100, driver 580): the cache caps it (``NUMBA_POOL_MANAGED_MAX_SIZE``)."""

from __future__ import annotations

from cuda.bindings import driver as _cuda

from ..cuda.driver import OUT_OF_MEMORY, SUCCESS, check, report_failure
from . import captures
from .fences import PrivateStream

#: ``cuMemHostAlloc`` flag that maps a pinned block into the device's address space.
DEVICEMAP = int(_cuda.CU_MEMHOSTALLOC_DEVICEMAP)


class PinnedBacking:
    """Pinned host blocks: ``cuMemHostAlloc(size, flags)`` and ``cuMemFreeHost``; a mapped block
    (``CU_MEMHOSTALLOC_DEVICEMAP``) gets its device address from ``cuMemHostGetDevicePointer``.
    A block still in use at a reset is freed by its release (:attr:`frees_orphans`), as Numba
    frees its own: its host memory stays valid until the array goes."""

    kind = "pinned"
    prefix = "host"  # of the statistics' keys (host_reserved_bytes ...)
    cap_variable = "NUMBA_POOL_HOST_MAX_SIZE"
    frees_orphans = True

    def __init__(self, cu):
        self._cu = cu

    def allocate(self, rounded: int, flags: int) -> tuple[int, int | None] | None:
        """A new block of ``rounded`` bytes, ``(host, device address or None)``; None if out of pinned memory.

        :raises CudaAPIError: any other driver error."""
        err, host = self._cu.cuMemHostAlloc(rounded, flags)
        if err == OUT_OF_MEMORY:
            return None
        check((err, host), f"cuMemHostAlloc({rounded}, flags={flags:#x})")
        host = int(host)
        if not flags & DEVICEMAP:
            return host, None
        result = self._cu.cuMemHostGetDevicePointer(host, 0)
        if result[0] != SUCCESS:
            report_failure(self._cu.cuMemFreeHost(host), "cuMemFreeHost")
        return host, int(check(result, "cuMemHostGetDevicePointer"))

    def free(self, address: int) -> tuple:
        """Give a block back (``cuMemFreeHost``); the driver's result tuple."""
        return self._cu.cuMemFreeHost(address)

    def refused_by(self) -> str:
        return "the host (cuMemHostAlloc)"

    def trim(self) -> None:
        """After blocks were given back: nothing more (``cuMemFreeHost`` returns them at once)."""

    def describe(self, flags: int) -> str:
        return f"pinned host memory allocating {{size}} bytes (a block of {{rounded}} bytes, cuMemHostAlloc flags {flags:#x})"


class ManagedBacking:
    """Managed blocks from one device's managed mempool, the same address on host and device
    (``cuMemAllocFromPoolAsync`` and ``cuMemFreeAsync`` on a private non-blocking stream, never the legacy
    one, a barrier between all blocking streams: rule 4 of :mod:`numba_pool.allocator`).  The cache gives back
    only idle blocks (rule 9) and the pool makes no allocation wait for another stream (internal dependencies
    off), so what it hands out on that stream is idle memory: the host may write it at once.  A block in use
    at a reset stays in use, back to the cache when its array goes (:attr:`frees_orphans` is false): the pool
    outlives the reset, and freeing the memory of a live NumPy array would crash the host at its next access.

    :param cu: the driver object.
    :param pool: the managed mempool (:class:`numba_pool.cuda.mempool.MemPool`, ``managed``)."""

    kind = "managed"
    prefix = "managed"
    cap_variable = "NUMBA_POOL_MANAGED_MAX_SIZE"
    frees_orphans = False

    def __init__(self, cu, pool):
        self._cu = cu
        self.pool = pool
        self._side = captures.SideStream(cu, "managed blocks")  # for allocations beside a capture (rule 13)
        self._private = PrivateStream(cu, "managed blocks")  # every other allocation and free

    def allocate(self, rounded: int, flags: int) -> tuple[int, int] | None:
        """A new managed block of ``rounded`` bytes, ``(address, address)``; None when the pool cannot grow.
        While a stream capture is under way (rule 13: the legacy stream would join or break it, and the
        caller is in relaxed capture mode), on a side stream, synchronized.

        :raises CudaAPIError: any other driver error."""
        beside = bool(captures.underway)
        stream = self._side.handle if beside else self._private.handle
        err, ptr = self._cu.cuMemAllocFromPoolAsync(rounded, self.pool.handle, stream)
        if err == OUT_OF_MEMORY:
            return None
        address = int(check((err, ptr), f"cuMemAllocFromPoolAsync({rounded} bytes, managed mempool)"))
        if beside:
            check(self._cu.cuStreamSynchronize(stream), "cuStreamSynchronize (managed block beside a capture)")
        else:  # the host may write it at once: the allocation is complete first
            self._private.complete()
        return address, address

    def free(self, address: int) -> tuple:
        """Return an idle block to the managed pool (``cuMemFreeAsync`` on the private stream, in the owner's
        context: the cache frees under its lock, at an allocation, trim or reset); the driver's result."""
        return self._cu.cuMemFreeAsync(self._cu.CUdeviceptr(address), self._private.handle)

    def refused_by(self) -> str:
        return f"the device (managed mempool of device {self.pool.device_id})"

    def trim(self) -> None:
        """After blocks were given back: synchronize the context (``cuCtxSynchronize``) so their stream-ordered
        frees complete, and release the managed pool's unused memory (``cuMemPoolTrimTo(0)``)."""
        check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize (managed trim)")
        self.pool.trim(0)

    def describe(self, flags: int) -> str:
        return "managed memory allocating {size} bytes (a block of {rounded} bytes)"
