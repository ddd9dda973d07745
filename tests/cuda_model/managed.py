"""Managed (unified) memory in the model: ``cuMemAllocManaged`` / ``cuMemFree`` and pools made with
``CU_MEM_ALLOCATION_TYPE_MANAGED``, whose allocations the *host* uses too (:meth:`_ManagedCalls.host_use`
on their addresses), and ``cuMemPrefetchAsync``.

``cuMemAllocManaged`` is synchronous: its allocation is an op of the host (complete, the host may use the
memory at once), in an implicit managed pool no program sees.  ``cuMemFree`` is not assumed to
synchronize (the driver's documentation promises nothing): the range is unmapped at once and the next
allocation, of any kind, may get it; a new owner's use unordered with an old owner's is then caught per
granule, as for every reuse.  A host use before the host has observed the allocation itself complete
(``cuMemAllocFromPoolAsync`` is an operation on its stream: "Stream Ordered Memory Allocator"
requires it complete before another stream uses the memory) is a violation.

A host use of managed memory is an op of the host's pseudo stream (as for pinned memory,
:class:`~cuda_model.calls._HostCalls`), checked per granule against the device ops of the same
memory: the host is ordered after a device op only when it has observed that op complete
(``cuEventQuery`` returning ``CUDA_SUCCESS`` for an event recorded after it, or a synchronize),
and device ops enqueued after a host use are ordered after it.  A new owner that the host writes
at once must therefore wait for the host to have *seen* the previous owner's last kernel finish,
not merely for stream order.  A prefetch is an op on its stream that touches no granule:
migrating pages is coherent with every access ("Memory accesses to this range are always
coherent and are allowed even when the data is actively being migrated", cuMemPrefetchAsync).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable, Optional

from cuda.bindings import driver as _cu

from .base import GRANULE, SUCCESS, _R, _call_site, _handle, _round_up
from .calls import _driver
from .memory import Violation, _Allocation, _Use
from .ordering import HOST_HANDLE, HOST_ID, Op

if TYPE_CHECKING:
    from .model import CudaModel


_ATTACH = {int(_cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL), int(_cu.CUmemAttach_flags.CU_MEM_ATTACH_HOST)}


class _ManagedCalls:
    """``cuMemAllocManaged``, ``cuMemFree``, ``cuMemPrefetchAsync`` and host uses of managed memory."""

    _managed_pool = None  # the implicit pool of cuMemAllocManaged, made at its first call

    @_driver
    def cuMemAllocManaged(self: "CudaModel", size: Any, flags: Any):
        nbytes = int(size)
        if nbytes <= 0 or int(flags) not in _ATTACH:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        if self._managed_pool is None:
            self._managed_pool = self._memory.create_pool(0, managed=True)
        pool, nbytes = self._managed_pool, _round_up(nbytes)
        if not self._memory.fits(pool, nbytes):
            self._counts["oom"] += 1
            return _R.CUDA_ERROR_OUT_OF_MEMORY, None
        base = self._memory.map_fresh(pool, nbytes)
        self._memory.add_live(_Allocation(base, nbytes, pool, self._host_op(), _call_site()))
        self._counts["managed_allocs"] += 1
        return SUCCESS, _cu.CUdeviceptr(base)

    @_driver
    def cuMemFree(self: "CudaModel", ptr: Any):
        """Of ``cuMemAllocManaged`` memory (the only ``cuMemAlloc*`` the model has)."""
        base = _handle(ptr)
        alloc = self._memory.live.get(base)
        if alloc is None or alloc.pool is not self._managed_pool:
            self._report("free of unknown pointer / double free", None, "cuMemFree", base, base + 1)
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._memory.free(base, self._host_op())
        self._memory.trim_pool(alloc.pool, 0, lambda op: True)
        self._counts["managed_frees"] += 1
        return (SUCCESS,)

    @_driver
    def cuMemPrefetchAsync(self: "CudaModel", ptr: Any, count: Any, location: Any, flags: Any, stream: Any):
        s = self._stream(stream, "cuMemPrefetchAsync")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        base, nbytes = _handle(ptr), int(count)
        alloc = self._memory.find(base)
        if (alloc is None or not alloc.pool.managed or base + nbytes > alloc.base + alloc.size or int(flags)
                or location.type not in (_cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE,
                                         _cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST)):
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._new_op(s, "prefetch")
        self._counts["prefetches"] += 1
        return (SUCCESS,)

    def managed_stats(self: "CudaModel") -> dict:
        """``cuMemAllocManaged`` memory: live allocations, reserved bytes, allocations and frees."""
        with self._lock:
            pool = self._managed_pool
            live = sum(1 for a in self._memory.live.values() if pool is not None and a.pool is pool)
            return {"live": live, "reserved": pool.reserved if pool is not None else 0,
                    "allocs": self._counts["managed_allocs"], "frees": self._counts["managed_frees"]}

    def host_use(self: "CudaModel", address: int, nbytes: int, owner: Hashable, site: Optional[str] = None) -> Op:
        """The CPU reads or writes bytes [address, address + nbytes) for ``owner`` now: pinned
        host memory, or managed pool memory (every byte in a live allocation of a managed pool,
        else a violation)."""
        site = site or _call_site()
        address, nbytes = int(address), int(nbytes)
        with self._lock:
            if self._memory.find(address) is None:
                return super().host_use(address, nbytes, owner, site)
            op = self._host_op()
            for lo, hi in self._memory.uncovered(address, address + nbytes):
                self.violations.append(Violation("host use of unallocated memory", lo, hi, new_owner=owner,
                                                 new_stream=HOST_HANDLE, new_stream_id=HOST_ID, new_site=site))
            alloc = self._memory.find(address)
            if not alloc.pool.managed:
                self.violations.append(Violation("host use of device memory", address, address + nbytes,
                                                 new_owner=owner, new_stream=HOST_HANDLE, new_stream_id=HOST_ID,
                                                 new_site=site))
            elif not self._streams.complete(alloc.op):  # the allocation is complete before any use elsewhere
                self.violations.append(Violation(
                    "host use of managed memory before its allocation completed", address, address + nbytes,
                    "cuMemAllocFromPoolAsync", alloc.op.handle, alloc.op.stream_id, alloc.site, owner, HOST_HANDLE, HOST_ID, site))
            lo, hi = address // GRANULE * GRANULE, _round_up(address + nbytes)
            for start, end, prev in self._granules.use(lo, hi, _Use(op, owner, site)):
                self.violations.append(Violation(
                    "unordered reuse of managed memory", start, end, prev.owner, prev.op.handle, prev.op.stream_id,
                    prev.site, owner, HOST_HANDLE, HOST_ID, site))
            self._counts["managed_host_uses"] += 1
            return op
