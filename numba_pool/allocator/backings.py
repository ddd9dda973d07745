"""Where the blocks of a host-rule cache (:class:`~.host_blocks.HostBlocks`) come from and go back: the two
kinds of memory whose next owner may be the CPU (rule 9 of :mod:`numba_pool.allocator`).  A backing knows
nothing of events or reuse: the cache decides when a block may go back.

* :class:`PinnedBacking`: page-locked host memory, ``cuMemHostAlloc`` / ``cuMemFreeHost``
  (``NUMBA_POOL_HOST``), mapped into the device's address space on request.
* :class:`ManagedBacking`: managed (unified) memory, ``cuMemAllocManaged`` / ``cuMemFree`` (``NUMBA_POOL_MANAGED``),
  capped by the cache (``NUMBA_POOL_MANAGED_MAX_SIZE``)."""

from __future__ import annotations

from cuda.bindings import driver as _cuda

from ..cuda.driver import OUT_OF_MEMORY, SUCCESS, check, report_failure

#: ``cuMemHostAlloc`` flag that maps a pinned block into the device's address space.
DEVICEMAP = int(_cuda.CU_MEMHOSTALLOC_DEVICEMAP)
#: ``cuMemAllocManaged`` flag: the memory may be accessed from any stream of any device (Numba's default).
ATTACH_GLOBAL = int(_cuda.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)


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
    """Managed blocks of one device: ``cuMemAllocManaged(rounded, CU_MEM_ATTACH_GLOBAL)``, the same address on host
    and device, and ``cuMemFree``, as Numba's own managed arrays (Note [Managed blocks are not from a mempool]).
    The allocation is synchronous, so the host may write the block at once; the cache gives back only idle blocks
    (rule 9).  A block in use at a reset stays in use, back to the cache when its array goes (:attr:`frees_orphans`
    is false): freeing the memory of a live NumPy array would crash the host at its next access.

    Note [Managed blocks are not from a mempool]
        A managed mempool (``CU_MEM_ALLOCATION_TYPE_MANAGED``) allocates in 4 µs against ``cuMemAllocManaged``'s
        25, but on driver 580 what it hands out again after a free is pathological: a 4 GiB range freed, trimmed
        and reallocated took 8.9 s for a device memset after a host read (0.6 s on fresh memory), and its pages'
        device memory stayed taken after ``cuMemPoolTrimTo(0)`` (4 GiB of 4; H200, 2026-11-27, docs/perf-notes.md,
        "Managed memory").  The cache's own reuse is the fast path; a miss costs what Numba's default does.

    :param cu: the driver object.
    :param device_id: the device (for messages)."""

    kind = "managed"
    prefix = "managed"
    cap_variable = "NUMBA_POOL_MANAGED_MAX_SIZE"
    frees_orphans = False

    def __init__(self, cu, device_id: int = 0):
        self._cu = cu
        self.device_id = device_id

    def allocate(self, rounded: int, flags: int) -> tuple[int, int] | None:
        """A new managed block of ``rounded`` bytes, ``(address, address)``; None when the driver is out of memory.
        Beside a capture the caller is in relaxed capture mode (rule 13), where ``cuMemAllocManaged`` is allowed.

        :raises CudaAPIError: any other driver error."""
        err, ptr = self._cu.cuMemAllocManaged(rounded, ATTACH_GLOBAL)
        if err == OUT_OF_MEMORY:
            return None
        address = int(check((err, ptr), f"cuMemAllocManaged({rounded} bytes, CU_MEM_ATTACH_GLOBAL)"))
        return address, address

    def free(self, address: int) -> tuple:
        """Give an idle block back (``cuMemFree``, in the owner's context: the cache frees under its lock, at an
        allocation, trim or reset, never beside a capture); the driver's result."""
        return self._cu.cuMemFree(self._cu.CUdeviceptr(address))

    def refused_by(self) -> str:
        return f"the device (cuMemAllocManaged on device {self.device_id})"

    def trim(self) -> None:
        """After blocks were given back: nothing more (``cuMemFree`` returns them at once)."""

    def describe(self, flags: int) -> str:
        return "managed memory allocating {size} bytes (a block of {rounded} bytes)"
