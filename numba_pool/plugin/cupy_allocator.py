"""The CuPy door: :func:`cupy_allocator` for ``cupy.cuda.set_allocator`` (and ``using_allocator``) and
:func:`cupy_pinned_allocator` for ``cupy.cuda.set_pinned_memory_allocator``, as ``rmm.allocators.cupy`` gives
RMM's.  CuPy's arrays then come from the pool Numba's arrays use (one pool, one ``stats()``, one history per
device).  CuPy is imported at the first call only.

CuPy's semantics, kept: an allocation is for work on CuPy's current stream (``cupy.cuda.get_current_stream()``)
of CuPy's current device, and memory goes back when CuPy drops its last reference, as its ``MemoryAsyncPool``
frees on the allocation stream.  Here that drop is the release of rule 14 of :mod:`numba_pool.allocator` with
no stream named: ordered on the allocation stream, as a Numba array's drop is; work of another stream needs
``numba_pool.record_stream`` (CuPy's own pool would need the same care).  Pinned blocks follow the host rule
(rule 9): CuPy keeps a pinned buffer alive until its asynchronous copy's event completed."""

from __future__ import annotations

import sys

from cuda.bindings.driver import CUresult

from ..cuda.streams import LEGACY, as_stream_ref
from ..allocator.host_blocks import host_flags
from ..config.values import byte_count
from ..cuda.driver import OUT_OF_MEMORY
from ..cuda.errors import CudaAPIError
from .serving import cache_block, failed, recorded, release, serving_manager
from .state import process
from .torch_allocator import TorchDoor

_new = object.__new__
_NO_CONTEXT = CUresult.CUDA_ERROR_INVALID_CONTEXT  # Note [CuPy's first allocation in a thread]


class _DeviceOwner:
    """What CuPy's ``UnownedMemory`` keeps alive: one numba_pool block and its history record (set by
    :func:`cupy_allocator`); its collection is the block's drop."""

    __slots__ = ("block", "record")

    def __del__(self):  # never raises (rule 8)
        block = self.block
        if self.record is None:  # the common case without a frame: deallocate(block) with no stream named
            block.release(block)
        else:
            release(self.record, block.release, block)


def device_owner(block, record) -> _DeviceOwner:
    """The :class:`_DeviceOwner` of ``block`` (made without an ``__init__`` frame: the door's hot path)."""
    owner = _new(_DeviceOwner)
    owner.block, owner.record = block, record
    return owner


class _PinnedOwner:
    """A pinned block as CuPy's ``PinnedMemoryPointer`` wants its memory: ``ptr`` and ``size`` (bytes)."""

    __slots__ = ("ptr", "size", "block", "host")

    def __init__(self, block, host, size: int):
        self.ptr, self.size, self.block, self.host = block.ptr, size, block, host

    def __del__(self):
        self.host.deallocate(self.block, None)  # never raises (rule 8)


def cupy_allocator(nbytes: int):
    """``nbytes`` bytes of device memory for CuPy (``cupy.cuda.set_allocator(numba_pool.cupy_allocator)``),
    from the numba_pool allocator of CuPy's current device, stream-ordered on CuPy's current stream
    (``cuMemAllocFromPoolAsync``, or an arena block).
    :returns: a ``cupy.cuda.MemoryPointer`` over a ``cupy.cuda.UnownedMemory`` that owns the block.
    :raises ValueError: ``nbytes`` not a non-negative int (bytes).
    :raises ImportError: CuPy is not importable.
    :raises RuntimeError: numba_pool is not Numba's memory manager on the device.
    :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` after numba_pool's retry, with the pool's sizes."""
    size = nbytes
    if type(size) is not int or not 0 < size < 1 << 64:  # the common case checked inline: no frame
        size = byte_count(nbytes, "numba_pool.cupy_allocator", "nbytes", positive=False)
    cuda = (sys.modules.get("cupy") or _cupy("cupy_allocator")).cuda
    device_id = cuda.runtime.getDevice()
    if size == 0:
        return cuda.MemoryPointer(cuda.UnownedMemory(0, 0, None, device_id), 0)
    stream = cuda.get_current_stream()
    if stream.ptr == 0:  # the null stream: through the door's free list (Note [The doors' free lists])
        native = (process.cupy_door or _legacy_door()).native
        if native is not None:
            owner = native.malloc_owned(size, device_id)  # a kept block, or CupyDoor._malloc's
            return cuda.MemoryPointer(cuda.UnownedMemory(owner.address, size, owner, device_id), 0)
    manager = serving_manager(device_id, "numba_pool.cupy_allocator")
    ref = LEGACY if stream.ptr == 0 else _stream_ref(stream)
    try:
        block = manager.allocate_block(size, ref)
    except CudaAPIError as err:
        if err.code != _NO_CONTEXT:
            if err.code == OUT_OF_MEMORY:  # (the log's allocate failure rows)
                failed(manager, "cupy", size, ref)
            raise
        cuda.runtime.free(0)  # Note [CuPy's first allocation in a thread]
        block = manager.allocate_block(size, ref)
    record = None if process.recording is None and manager.log is None else recorded(manager, block, "cupy")
    return cuda.MemoryPointer(cuda.UnownedMemory(block.start, size, device_owner(block, record), device_id), 0)


class CupyDoor(TorchDoor):
    """The CuPy door's null-stream allocations: PyTorch's door's ends (a :class:`~.serving.DoorTable` of live blocks
    behind a compiled free list, Note [The doors' free lists]), called with stream 0 by
    :func:`cupy_allocator` through ``native.malloc_owned``, whose owner's collection is the free.  Its ``_malloc``
    raises where PyTorch's returns a null pointer: CuPy's allocator raises."""

    _name = "numba_pool.cupy_allocator"
    _kind = "cupy"
    _skip = 5  # the two ``_malloc``s', ``cupy_allocator``'s (the compiled call between makes no frame)

    _raises = True

    def _malloc(self, size: int, device: int, stream) -> int:
        """Note [CuPy's first allocation in a thread]
            CuPy's own pool allocates with ``cudaMalloc``, which makes the device's primary context current in a
            thread that has none; numba_pool's driver calls do not, and fail there (``CUDA_ERROR_INVALID_CONTEXT``)
            when an allocation is the thread's first CUDA call.  The door then does what CuPy would have,
            ``cupy.cuda.runtime.free(0)`` (``cudaFree(0)``: the CUDA runtime's primary context made current), and
            allocates again.  Only a call that reaches the driver can meet it: a kept block's reuse makes none."""
        try:
            return super()._malloc(size, device, stream)
        except CudaAPIError as err:
            if err.code != _NO_CONTEXT:
                raise
        _cupy("cupy_allocator").cuda.runtime.free(0)
        return super()._malloc(size, device, stream)


def _legacy_door() -> CupyDoor:
    # The process's CuPy door, made once, at its first null-stream allocation: its owners' frees need it alive
    return process.cupy_door_made(CupyDoor)


def cupy_pinned_allocator(nbytes: int):
    """``nbytes`` bytes of page-locked host memory for CuPy (``cupy.cuda.set_pinned_memory_allocator``), from
    numba_pool's pinned cache of CuPy's current device (``NUMBA_POOL_HOST=1``; ``cuMemHostAlloc`` blocks,
    handed out again only once the host saw their last use finish).
    :returns: a ``cupy.cuda.PinnedMemoryPointer``.
    :raises ValueError: ``nbytes`` not a non-negative int (bytes).
    :raises ImportError: CuPy is not importable.
    :raises RuntimeError: numba_pool is not the memory manager, or its pinned cache is off.
    :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the cache's sizes."""
    size = byte_count(nbytes, "numba_pool.cupy_pinned_allocator", "nbytes", positive=False)
    cupy = _cupy("cupy_pinned_allocator")
    manager = serving_manager(cupy.cuda.runtime.getDevice(), "numba_pool.cupy_pinned_allocator")
    block, host = cache_block(manager.host, "numba_pool.cupy_pinned_allocator: numba_pool's pinned cache is off: "
                              "set NUMBA_POOL_HOST=1 (or install(host=True)) before Numba's first CUDA call",
                              max(size, 1), LEGACY, host_flags(False, True, False))
    return cupy.cuda.PinnedMemoryPointer(_PinnedOwner(block, host, size), 0)


def _cupy(name: str):
    try:
        import cupy
    except ImportError as err:
        raise ImportError(f"numba_pool.{name} needs CuPy, which is not importable here ({err})") from None
    return cupy


def _stream_ref(stream):
    # A stream other than CuPy's null stream (ptr 0: legacy), the last one kept (Note [The last stream named]).
    last = process.cupy_stream
    if last[0] is stream:
        return last[1]
    ref = as_stream_ref(stream if hasattr(stream, "__cuda_stream__") else stream.ptr)
    if type(stream).__name__ == "Stream" and ref.thread is None:  # cupy.cuda.Stream's own, not per-thread
        process.cupy_stream = (stream, ref)
    return ref
