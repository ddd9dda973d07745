"""Where a host-rule cache's blocks (:class:`~.host_blocks.HostBlocks`) come from and go: the two memories whose next
owner may be the CPU (rule 9 of :mod:`numba_pool.allocator`).  Backings know nothing of events or reuse.

* :class:`PinnedBacking`: pinned host memory (``NUMBA_POOL_HOST``; mappable), ``cuMemHostAlloc`` / ``cuMemFreeHost``.
* :class:`ManagedBacking`: managed (unified) memory (``NUMBA_POOL_MANAGED``), ``cuMemAllocManaged`` / ``cuMemFree``."""

from __future__ import annotations

from cuda.bindings import driver as _cuda

from ..cuda.driver import OUT_OF_MEMORY, SUCCESS, check, report_failure

DEVICEMAP = int(_cuda.CU_MEMHOSTALLOC_DEVICEMAP)  #: ``cuMemHostAlloc`` flag mapping a pinned block for the device.
#: ``cuMemAllocManaged`` flag: the memory may be accessed from any stream of any device (Numba's default).
ATTACH_GLOBAL = int(_cuda.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)


class PinnedBacking:
    """Pinned host blocks (``cuMemHostAlloc``/``cuMemFreeHost``; mapped: ``cuMemHostGetDevicePointer`` too).  One live
    at a reset is freed by its release (:attr:`frees_orphans`), as Numba's: valid until its array goes."""

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
    """Managed blocks of one device: ``cuMemAllocManaged(rounded, CU_MEM_ATTACH_GLOBAL)``, one address on host and
    device, and ``cuMemFree``, as Numba does (Note [Managed blocks are not from a mempool]).  Allocation is synchronous
    (the host may write at once); only idle blocks go back (rule 9).  A block live at a reset comes back when its array
    goes (:attr:`frees_orphans` false): freeing a live NumPy array's memory would crash at its next host access.
    :param cu: the driver object.  :param device_id: the device (for messages).

    Note [Managed blocks are not from a mempool]
        A managed mempool (``CU_MEM_ALLOCATION_TYPE_MANAGED``) allocates in 4 µs against ``cuMemAllocManaged``'s
        25, but on driver 580 what it hands out again after a free is pathological: a 4 GiB range freed, trimmed
        and reallocated took 8.9 s for a device memset after a host read (0.6 s on fresh memory), and its pages'
        device memory stayed taken after ``cuMemPoolTrimTo(0)`` (4 GiB of 4; H200, 2026-11-27, docs/perf-notes.md,
        "Managed memory").  The cache's own reuse is the fast path; a miss costs what Numba's default does."""

    kind = "managed"
    prefix = "managed"
    cap_variable = "NUMBA_POOL_MANAGED_MAX_SIZE"
    frees_orphans = False

    def __init__(self, cu, device_id: int = 0):
        self._cu = cu
        self.device_id = device_id

    def allocate(self, rounded: int, flags: int) -> tuple[int, int] | None:
        """A new managed ``rounded``-byte block, ``(address, address)``; None if out of memory.  Beside a capture the
        caller is in relaxed mode (rule 13), allowing ``cuMemAllocManaged``.  :raises CudaAPIError: other errors."""
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
