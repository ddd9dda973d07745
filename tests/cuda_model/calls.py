"""The modelled driver functions, grouped by what they act on; :class:`~cuda_model.CudaModel`
inherits them all."""

from __future__ import annotations

import functools
import os
import re
from typing import TYPE_CHECKING, Any, Callable, Hashable, Optional

from cuda.bindings import driver as _cu

from .base import _ATTR, GRANULE, SUCCESS, _handle, _R, _round_up, _call_site
from .memory import Violation, _Allocation, _Piece, _Pool, _Use
from .ordering import HOST_HANDLE, HOST_ID, Op, _Stream, op_a_precedes

if TYPE_CHECKING:
    from .model import CudaModel

# --------------------------------------------------------------------------- driver calls


#: The one modelled context's handle.
CONTEXT = _cu.CUcontext(0xC0)
#: Driver functions that need no current context (the rest fail with
#: ``CUDA_ERROR_INVALID_CONTEXT`` in a thread that has none: see :meth:`CudaModel.leave_context`).
_CONTEXT_FREE = re.compile(r"cuDevice|cuCtxGetCurrent|cuCtxPushCurrent|cuCtxPopCurrent")
#: How many values each modelled function returns after its ``CUresult`` (default 0).
_VALUES = {"cuStreamCreate": 1, "cuStreamGetId": 1, "cuStreamGetFlags": 1, "cuStreamIsCapturing": 1, "cuEventCreate": 1, "cuMemPoolCreate": 1,
           "cuMemPoolGetAttribute": 1, "cuMemAllocFromPoolAsync": 1, "cuMemGetInfo": 2,
           "cuPointerGetAttribute": 1, "cuMemHostAlloc": 1, "cuMemHostGetDevicePointer": 1, "cuMemAllocManaged": 1,
           "cuCtxGetCurrent": 1, "cuCtxPopCurrent": 1,
           "cuMemPoolExportToShareableHandle": 1, "cuMemPoolExportPointer": 1}


def _driver(fn: Callable) -> Callable:
    """A modelled driver function: ``preempt("enter"/"exit", name)`` around it (outside the
    lock, not re-entered from inside preempt), the state change under the model's lock.  In a
    thread with no current context, a function that needs one fails with
    ``CUDA_ERROR_INVALID_CONTEXT`` and changes nothing."""
    name = fn.__name__
    needs_context = not _CONTEXT_FREE.match(name)
    refused = (_R.CUDA_ERROR_INVALID_CONTEXT,) + (None,) * _VALUES.get(name, 0)

    @functools.wraps(fn)
    def call(self: "CudaModel", *args: Any, **kwargs: Any):
        outer = self.preempt is not None and not getattr(self._tls, "in_preempt", False)
        if outer:
            self._run_preempt("enter", name)
        with self._lock:
            self._counts["driver_calls"] += 1
            if needs_context and not self._contexts():
                self._counts["no_context"] += 1
                result = refused
            else:
                result = fn(self, *args, **kwargs)
        if outer:
            self._run_preempt("exit", name)
        return result

    return call


class _StreamCalls:
    """Stream, event and synchronization driver functions."""

    @_driver
    def cuStreamCreate(self, flags: Any = 0):
        blocking = not (int(flags) & int(_cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        return SUCCESS, _cu.CUstream(self._streams.create(blocking).handle)

    @_driver
    def cuStreamDestroy(self, stream: Any):
        s = self._user_stream(stream, "cuStreamDestroy")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        self._streams.destroy(s)
        return (SUCCESS,)

    @_driver
    def cuStreamGetId(self, stream: Any):
        s = self._stream(stream, "cuStreamGetId")
        return (SUCCESS, s.id) if s is not None else (_R.CUDA_ERROR_INVALID_HANDLE, None)

    @_driver
    def cuStreamGetFlags(self, stream: Any):
        s = self._stream(stream, "cuStreamGetFlags")
        if s is None:
            return _R.CUDA_ERROR_INVALID_HANDLE, None
        return SUCCESS, 0 if s.blocking else int(_cu.CUstream_flags.CU_STREAM_NON_BLOCKING)

    @_driver
    def cuStreamSynchronize(self, stream: Any):
        s = self._stream(stream, "cuStreamSynchronize")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        self._streams.host_learns(s.last_vc)
        self._after_sync()
        return (SUCCESS,)

    @_driver
    def cuCtxGetCurrent(self):
        stack = self._contexts()
        return SUCCESS, stack[-1] if stack else _cu.CUcontext(0)

    @_driver
    def cuCtxPushCurrent(self, context: Any):
        if int(context) not in self._known_contexts:
            return (_R.CUDA_ERROR_INVALID_CONTEXT,)
        self._tls.contexts = self._contexts() + [_cu.CUcontext(int(context))]
        self._counts["context_pushes"] += 1
        return (SUCCESS,)

    @_driver
    def cuCtxPopCurrent(self):
        stack = self._contexts()
        if not stack:
            return _R.CUDA_ERROR_INVALID_CONTEXT, None
        self._tls.contexts = stack[:-1]
        return SUCCESS, stack[-1]

    @_driver
    def cuCtxSynchronize(self):
        """The current context's streams only."""
        self._streams.host_learns_all(self._current_context())
        self._after_sync()
        return (SUCCESS,)

    @_driver
    def cuEventCreate(self, flags: Any = 0):
        return SUCCESS, _cu.CUevent(self._events.create(self._current_context()).handle)

    @_driver
    def cuEventDestroy(self, event: Any):
        e = self._event(event, "cuEventDestroy")
        if e is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        self._events.destroy(e)
        return (SUCCESS,)

    @_driver
    def cuEventRecord(self, event: Any, stream: Any = 0):
        e, s = self._event(event, "cuEventRecord"), self._stream(stream, "cuEventRecord")
        if e is None or s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if e.context != s.context:  # "the event and the stream must belong to the same context"
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        e.record = self._new_op(s, "event record")
        return (SUCCESS,)

    @_driver
    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: Any = 0):
        """Orders ``stream`` after the event's record as it is now; never recorded: no-op."""
        s, e = self._stream(stream, "cuStreamWaitEvent"), self._event(event, "cuStreamWaitEvent")
        if e is None or s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if e.record is not None:
            self._new_op(s, "stream wait", extra=(e.record.vc,))
        return (SUCCESS,)

    @_driver
    def cuEventSynchronize(self, event: Any):
        e = self._event(event, "cuEventSynchronize")
        if e is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if e.record is not None:
            self._streams.host_learns(e.record.vc)
        self._after_sync()
        return (SUCCESS,)

    @_driver
    def cuEventQuery(self, event: Any):
        """SUCCESS only when the host already knows the recorded work is complete, or, with
        ``gpu_eager`` set (an execution where the device has finished all it can by the time of
        any query), when it can complete: the host learns it then, as from a real query."""
        e = self._event(event, "cuEventQuery")
        if e is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if e.record is None or self._streams.complete(e.record):
            return (SUCCESS,)
        if getattr(self, "gpu_eager", False) and self._can_complete(e.record):
            self._streams.host_learns(e.record.vc)
            return (SUCCESS,)
        return (_R.CUDA_ERROR_NOT_READY,)

    def _can_complete(self, op) -> bool:
        """Whether ``op`` can complete without the host doing anything more (nothing it is
        ordered after waits for a later operation); overridden where the model has waiting kernels."""
        return True


class _MemoryCalls:
    """Memory pool and allocation driver functions."""

    _HIGH = {_ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: ("reserved_high", "reserved"),
             _ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH: ("used_high", "used")}
    _READ = {_ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: "threshold",
             _ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: "reserved",
             _ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: "reserved_high",
             _ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT: "used",
             _ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH: "used_high"}

    @_driver
    def cuMemPoolCreate(self, props: Any):
        """A managed pool (``CU_MEM_ALLOCATION_TYPE_MANAGED``) refuses ``maxSize`` and IPC handle
        types with ``CUDA_ERROR_INVALID_VALUE``, as the driver does (H100, driver 580)."""
        if props is None:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        max_size = int(getattr(props, "maxSize", 0) or 0)
        managed = props.allocType == _cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED
        if managed and (max_size or int(props.handleTypes)):
            return _R.CUDA_ERROR_INVALID_VALUE, None
        pool = self._memory.create_pool(max_size, managed=managed)
        pool.exportable = bool(int(props.handleTypes))  # graphs refuse exportable pools (cuda_model.capture)
        return SUCCESS, _cu.CUmemoryPool(pool.handle)

    @_driver
    def cuDeviceGetDefaultMemPool(self, device: Any):
        if _handle(device) != 0:
            return _R.CUDA_ERROR_INVALID_DEVICE, None
        if self._memory.default is None:
            self._memory.default = self._memory.create_pool(0, is_default=True)
        return SUCCESS, _cu.CUmemoryPool(self._memory.default.handle)

    @_driver
    def cuMemPoolDestroy(self, pool: Any):
        p = self._pool(pool, "cuMemPoolDestroy")
        if p is None or p.is_default:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._memory.destroy_pool(p)
        self._memory.trim_pool(p, 0, self._streams.complete)
        return (SUCCESS,)

    @_driver
    def cuMemPoolSetAttribute(self, pool: Any, attr: Any, value: Any):
        p = self._pool(pool, "cuMemPoolSetAttribute")
        if p is None:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        value = int(value)
        if attr == _ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            p.threshold = value
        elif attr == _ATTR.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES and value == 0:
            pass  # the modelled pool never inserts internal dependencies (_allocate's eligible)
        elif attr in self._HIGH and value == 0:  # only a reset to the current value is allowed
            high, current = self._HIGH[attr]
            setattr(p, high, getattr(p, current))
        else:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        return (SUCCESS,)

    @_driver
    def cuMemPoolGetAttribute(self, pool: Any, attr: Any):
        refused = self._unsafe_refused("cuMemPoolGetAttribute")  # measured on an H200: capture.py's list
        if refused:
            return refused, None
        p = self._pool(pool, "cuMemPoolGetAttribute")
        if p is None or attr not in self._READ:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        return SUCCESS, _cu.cuuint64_t(getattr(p, self._READ[attr]))

    @_driver
    def cuMemPoolTrimTo(self, pool: Any, keep_bytes: Any):
        p = self._pool(pool, "cuMemPoolTrimTo")
        if p is None:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._counts["unmapped_bytes"] += self._memory.trim_pool(p, int(keep_bytes), self._streams.complete)
        return (SUCCESS,)

    @_driver
    def cuMemAllocFromPoolAsync(self, size: Any, pool: Any, stream: Any):
        """0 bytes: ``CUDA_ERROR_INVALID_VALUE``, as ``cuMemAlloc`` documents (what the async
        call does is undocumented and differs between driver modes: the strict answer)."""
        s = self._stream(stream, "cuMemAllocFromPoolAsync")
        if s is None:
            return _R.CUDA_ERROR_INVALID_HANDLE, None
        p = self._pool(pool, "cuMemAllocFromPoolAsync")
        if p is None or int(size) <= 0:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        base = self._allocate(p, _round_up(int(size)), s)
        if base is None:
            self._counts["oom"] += 1
            return _R.CUDA_ERROR_OUT_OF_MEMORY, None
        return SUCCESS, _cu.CUdeviceptr(base)

    @_driver
    def cuMemFreeAsync(self, ptr: Any, stream: Any):
        s = self._stream(stream, "cuMemFreeAsync")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        base = _handle(ptr)
        if base not in self._memory.live:
            self._report("free of unknown pointer / double free", s, "cuMemFreeAsync", base, base + 1)
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._memory.free(base, self._new_op(s, "free"))
        self._counts["frees"] += 1
        return (SUCCESS,)

    @_driver
    def cuMemGetInfo(self):
        total = self._memory.device_total
        return SUCCESS, total - self._memory.total_reserved(), total

    @_driver
    def cuPointerGetAttribute(self, attribute: Any, ptr: Any):
        """``MEMPOOL_HANDLE`` and ``IS_MANAGED`` of a live pool allocation."""
        kinds = _cu.CUpointer_attribute
        if attribute not in (kinds.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, kinds.CU_POINTER_ATTRIBUTE_IS_MANAGED):
            return _R.CUDA_ERROR_INVALID_VALUE, None
        alloc = self._memory.find(_handle(ptr))
        if alloc is None:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        if attribute == kinds.CU_POINTER_ATTRIBUTE_IS_MANAGED:
            return SUCCESS, alloc.pool.managed
        return SUCCESS, alloc.pool.handle

    def _allocate(self, pool: _Pool, nbytes: int, s: _Stream) -> Optional[int]:
        """Eager reuse of an eligible free piece, else fresh memory (after unmapping this
        pool's completed free pieces when the cap is in the way); None: out of memory."""
        next_vc = self._streams.next_vc(s)

        opportunistic = getattr(self, "opportunistic_reuse", False)

        def eligible(piece: _Piece) -> bool:
            # FOLLOW_EVENT_DEPENDENCIES (incl. legacy-stream ordering) and same-stream order;
            # ALLOW_OPPORTUNISTIC once the host knows, or with opportunistic_reuse once the free
            # can complete (it has then: the host learns it below); no ALLOW_INTERNAL_DEPENDENCIES.
            op = piece.free_op
            return (op.stream_id == s.id or self._streams.complete(op) or op_a_precedes(op, next_vc)
                    or (opportunistic and self._can_complete(op)))

        taken = pool.take(nbytes, eligible)
        if taken is None:
            if not self._memory.fits(pool, nbytes):
                self._counts["unmapped_bytes"] += self._memory.trim_pool(pool, 0, self._streams.complete)
            if not self._memory.fits(pool, nbytes):
                return None
            base, pieces = self._memory.map_fresh(pool, nbytes), []
        else:
            base, pieces = taken
            for piece in pieces:  # reused as complete: the driver saw it so, at this call, on the host
                if piece.free_op.stream_id != s.id and not op_a_precedes(piece.free_op, next_vc):
                    self._streams.host_learns(piece.free_op.vc)
        op = self._new_op(s, "alloc")
        self._memory.add_live(_Allocation(base, nbytes, pool, op, _call_site()))
        self._count_alloc(pieces, s)
        return base

    def _count_alloc(self, pieces: list[_Piece], s: _Stream) -> None:
        self._counts["allocs"] += 1
        if not pieces:
            self._counts["fresh_allocs"] += 1
        elif all(p.free_op.stream_id == s.id for p in pieces):
            self._counts["reuse_same_stream"] += 1
        else:
            self._counts["reuse_cross_stream"] += 1
            if any(p.free_op.stream_id != s.id and not self._streams.complete(p.free_op) for p in pieces):
                self._counts["reuse_cross_stream_pending"] += 1


class _DeviceCalls:
    """The device queries numba_pool makes when it creates a pool: one device, whose mempools
    support POSIX file descriptor handles (``handle_types``), no peers, with concurrent managed
    access unless ``concurrent_managed_access`` is set to 0."""

    handle_types = int(_cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    concurrent_managed_access = 1

    @_driver
    def cuDeviceGetCount(self):
        return SUCCESS, 1

    @_driver
    def cuDeviceCanAccessPeer(self, device: Any, peer: Any):
        if _handle(device) != 0 or _handle(peer) != 0:
            return _R.CUDA_ERROR_INVALID_DEVICE, None
        return SUCCESS, 0

    @_driver
    def cuDeviceGetAttribute(self, attr: Any, device: Any):
        if _handle(device) != 0:
            return _R.CUDA_ERROR_INVALID_DEVICE, None
        if attr == _cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
            return SUCCESS, self.handle_types
        if attr == _cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
            return SUCCESS, 1
        if attr == _cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
            return SUCCESS, self.concurrent_managed_access
        raise AttributeError(f"CudaModel does not model cuDeviceGetAttribute({attr!r})")

    @_driver
    def cuMemPoolExportToShareableHandle(self, pool: Any, handle_type: Any, flags: Any):
        """A descriptor standing for the pool's (``/dev/null``: nothing imports it here)."""
        if self._pool(pool, "cuMemPoolExportToShareableHandle") is None or int(handle_type) != self.handle_types:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        return SUCCESS, os.open(os.devnull, os.O_RDONLY)

    @_driver
    def cuMemPoolExportPointer(self, ptr: Any):
        """Export data for a live allocation's base (zeros: the model has no other process)."""
        alloc = self._memory.find(_handle(ptr))
        if alloc is None or alloc.base != _handle(ptr):
            return _R.CUDA_ERROR_INVALID_VALUE, None
        return SUCCESS, _cu.CUmemPoolPtrExportData()

    @_driver
    def cuMemPoolSetAccess(self, pool: Any, descs: Any, count: Any):
        # Only the one device: a grant to another device is refused, as for a device that
        # does not exist.
        if self._pool(pool, "cuMemPoolSetAccess") is None or len(descs) != int(count):
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        if any(int(d.location.id) != 0 for d in descs):
            return (_R.CUDA_ERROR_INVALID_DEVICE,)
        return (SUCCESS,)


class _HostCalls:
    """Pinned host memory (``cuMemHostAlloc``/``cuMemFreeHost``/``cuMemHostGetDevicePointer``)
    and its uses.  A host block's uses are device ops (:meth:`CudaModel.copy_async`: an async
    copy, or a kernel touching mapped memory, on a stream) and *host* ops
    (:meth:`CudaModel.host_use`: the CPU reading or writing it), checked per granule like device
    memory.  A host op is ordered after a device op only when the host has observed that op
    complete (``cuEventQuery`` returning ``CUDA_SUCCESS`` for an event recorded after it,
    ``cuEventSynchronize``, ``cuStreamSynchronize``, ``cuCtxSynchronize``); device ops enqueued
    after a host op are ordered after it.  Mapped blocks: the device address is the host
    address (unified addressing).  ``cuMemFreeHost`` is not assumed to synchronize."""

    @_driver
    def cuMemHostAlloc(self, size: Any, flags: Any = 0):
        nbytes = int(size)
        if nbytes <= 0:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        if self._host_reserved + _round_up(nbytes) > self.host_total:
            self._counts["host_oom"] += 1
            return _R.CUDA_ERROR_OUT_OF_MEMORY, None
        nbytes = _round_up(nbytes)
        base = self._host_space.map(nbytes)
        self._host_live[base] = (nbytes, int(flags), _call_site())
        self._host_reserved += nbytes
        self._counts["host_allocs"] += 1
        return SUCCESS, base

    @_driver
    def cuMemFreeHost(self, ptr: Any):
        base = _handle(ptr)
        entry = self._host_live.pop(base, None)
        if entry is None:
            self._report("free of unknown pointer / double free", None, "cuMemFreeHost", base, base + 1)
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._host_reserved -= entry[0]
        self._host_space.unmap(base, entry[0])
        self._counts["host_frees"] += 1
        return (SUCCESS,)

    @_driver
    def cuMemHostGetDevicePointer(self, ptr: Any, flags: Any = 0):
        entry = self._host_find(_handle(ptr))
        if entry is None or int(flags) != 0 or not entry[1] & int(_cu.CU_MEMHOSTALLOC_DEVICEMAP):
            return _R.CUDA_ERROR_INVALID_VALUE, None
        return SUCCESS, _cu.CUdeviceptr(_handle(ptr))

    def _host_find(self, address: int):
        for base, entry in self._host_live.items():
            if base <= address < base + entry[0]:
                return entry
        return None

    def _check_host_use(self, s_handle: int, s_id: int, op: "Op", address: int, nbytes: int, owner: Hashable,
                        site: str) -> None:
        lo = address
        while lo < address + nbytes:  # every byte in a live host block
            base = next((b for b, e in self._host_live.items() if b <= lo < b + e[0]), None)
            if base is None:
                self.violations.append(Violation("use of unallocated host memory", lo, address + nbytes,
                                                 new_owner=owner, new_stream=s_handle, new_stream_id=s_id,
                                                 new_site=site))
                break
            lo = base + self._host_live[base][0]
        lo, hi = address // GRANULE * GRANULE, _round_up(address + nbytes)
        for start, end, prev in self._host_granules.use(lo, hi, _Use(op, owner, site)):
            self.violations.append(Violation(
                "unordered reuse of host memory", start, end, prev.owner, prev.op.handle, prev.op.stream_id,
                prev.site, owner, s_handle, s_id, site))

    def copy_async(self, stream: Any, address: int, nbytes: int, owner: Hashable,
                   site: Optional[str] = None) -> Optional["Op"]:
        """An async copy (or a kernel on mapped memory) on ``stream`` reading or writing host
        bytes [address, address + nbytes) for ``owner``: one op.  Returns it (None: invalid
        stream)."""
        site = site or _call_site()
        with self._lock:
            s = self._stream(stream, "copy_async")
            if s is None:
                return None
            op = self._new_op(s, "copy")
            self._counts["copies"] += 1
            self._check_host_use(s.handle, s.id, op, int(address), int(nbytes), owner, site)
            return op

    def host_use(self, address: int, nbytes: int, owner: Hashable, site: Optional[str] = None) -> "Op":
        """The CPU reads or writes host bytes [address, address + nbytes) for ``owner`` now."""
        site = site or _call_site()
        with self._lock:
            op = self._host_op()
            self._check_host_use(HOST_HANDLE, HOST_ID, op, int(address), int(nbytes), owner, site)
            return op

    def _host_op(self) -> "Op":
        """The next op of the host's pseudo stream: after everything the host has observed;
        device ops enqueued later are ordered after it (they join the host's clock)."""
        self._host_seq += 1
        vc = dict(self._streams.host_vc)
        vc[HOST_ID] = self._host_seq
        self._streams.host_vc[HOST_ID] = self._host_seq
        return Op(HOST_ID, self._host_seq, vc, "host use", HOST_HANDLE)

    def host_stats(self) -> dict:
        """Pinned host memory: live blocks, reserved bytes, cuMemHostAlloc/cuMemFreeHost calls."""
        with self._lock:
            return {"live": len(self._host_live), "reserved": self._host_reserved,
                    "allocs": self._counts["host_allocs"], "frees": self._counts["host_frees"]}
