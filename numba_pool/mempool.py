"""A CUDA stream-ordered memory pool (mempool) of one device, through cuda-python.

The pool is either a private one made with ``cuMemPoolCreate`` (optionally capped with
``CUmemPoolProps.maxSize``) or the device's default pool (``cuDeviceGetDefaultMemPool``), which
CuPy's and PyTorch's ``cudaMallocAsync`` back ends share.  Allocation and free themselves
(``cuMemAllocFromPoolAsync`` / ``cuMemFreeAsync``) are issued by the EMM manager directly on
:attr:`MemPool.handle`, to keep wrappers off the hot path; this module holds the rest: creation,
attributes (CUDA Driver API, "Stream Ordered Memory Allocator"), trimming and destruction.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuda.bindings import driver as cu
from numba.cuda.cudadrv.driver import CudaAPIError

from .config import PoolConfig

_ATTR = cu.CUmemPool_attribute


def check(result: tuple, call: str):
    """Unpack a cuda-python result tuple, raising Numba's ``CudaAPIError`` on failure.

    :returns: the single value the call returned (or a tuple of several, or None).
    :raises numba.cuda.cudadrv.driver.CudaAPIError: with the ``CUresult`` and ``call`` named.
    """
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaAPIError(err, f"numba_pool: {call} failed with {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass(frozen=True)
class PoolUsage:
    """The pool's own accounting (``CU_MEMPOOL_ATTR_*``), in bytes.

    *reserved* is device memory the pool holds (mapped); *used* is the part of it handed out to
    allocations not yet freed (stream-ordered frees count once issued).  The high watermarks
    are the peaks since creation or the last :meth:`MemPool.reset_high_watermarks`.
    """

    reserved: int
    reserved_high: int
    used: int
    used_high: int


class MemPool:
    """The mempool serving one device.

    :param device_id: CUDA device ordinal.
    :param config: the options in effect; ``use_default_pool``, ``max_size`` and
        ``release_threshold`` are applied here.
    :param device_total: the device's total memory in bytes (for a fractional ``max_size``).
    :raises CudaAPIError: when the driver refuses to create or configure the pool.
    """

    def __init__(self, device_id: int, config: PoolConfig, device_total: int):
        self.device_id = device_id
        self.is_private = not config.use_default_pool
        self.max_size = None if config.use_default_pool else config.max_size_bytes(device_total)
        if self.is_private:
            props = cu.CUmemPoolProps()
            props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            props.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
            props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            props.location.id = device_id
            props.maxSize = self.max_size or 0
            self.handle = check(cu.cuMemPoolCreate(props), "cuMemPoolCreate")
        else:
            self.handle = check(cu.cuDeviceGetDefaultMemPool(cu.CUdevice(device_id)), "cuDeviceGetDefaultMemPool")
        self.set_release_threshold(config.release_threshold)

    def set_release_threshold(self, nbytes: int) -> None:
        """Bytes of reserved memory the pool keeps when a stream, event or context synchronizes
        (``CU_MEMPOOL_ATTR_RELEASE_THRESHOLD``); ``config.KEEP_ALL`` keeps everything."""
        check(cu.cuMemPoolSetAttribute(self.handle, _ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(nbytes)),
              "cuMemPoolSetAttribute(RELEASE_THRESHOLD)")

    def _get(self, attr) -> int:
        return int(check(cu.cuMemPoolGetAttribute(self.handle, attr), f"cuMemPoolGetAttribute({attr.name})"))

    def usage(self) -> PoolUsage:
        """Reserved and used bytes with their high watermarks, read from the driver."""
        return PoolUsage(
            reserved=self._get(_ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            reserved_high=self._get(_ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
            used=self._get(_ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
            used_high=self._get(_ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        )

    def release_threshold(self) -> int:
        return self._get(_ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)

    def reset_high_watermarks(self) -> None:
        """Reset both high watermarks to the current values (setting them to 0 does that)."""
        for attr in (_ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, _ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH):
            check(cu.cuMemPoolSetAttribute(self.handle, attr, cu.cuuint64_t(0)), f"cuMemPoolSetAttribute({attr.name})")

    def trim(self, keep_bytes: int = 0) -> None:
        """Release reserved but unused memory until at most ``keep_bytes`` remain reserved
        (``cuMemPoolTrimTo``).  Memory whose stream-ordered free has not completed yet is not
        released: synchronize first to release it too."""
        check(cu.cuMemPoolTrimTo(self.handle, keep_bytes), "cuMemPoolTrimTo")

    def reserve(self, nbytes: int) -> None:
        """Grow the pool's reserve to at least ``nbytes`` (the seeds' pre-allocation): allocate
        that much, free it, and wait, so the memory stays reserved under the release threshold."""
        if nbytes <= 0:
            return
        stream = cu.CUstream(cu.CU_STREAM_LEGACY)
        ptr = check(cu.cuMemAllocFromPoolAsync(nbytes, self.handle, stream), f"cuMemAllocFromPoolAsync({nbytes})")
        check(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def destroy(self) -> None:
        """Destroy a private pool (``cuMemPoolDestroy``; the driver releases its memory once
        every allocation from it is freed) or trim the shared default pool to 0."""
        if self.is_private:
            check(cu.cuMemPoolDestroy(self.handle), "cuMemPoolDestroy")
        else:
            self.trim(0)


def device_memory_info() -> tuple[int, int]:
    """(free, total) bytes of the current context's device (``cuMemGetInfo``)."""
    return check(cu.cuMemGetInfo(), "cuMemGetInfo")


def pointer_mempool(pointer: int) -> int:
    """The handle (as int) of the mempool an address was allocated from, 0 if none
    (``CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE``)."""
    attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
    return int(check(cu.cuPointerGetAttribute(attr, pointer), "cuPointerGetAttribute(MEMPOOL_HANDLE)"))


class SlabSource:
    """The arena's upstream on the GPU (:class:`numba_pool.arena.Upstream`): slabs from the
    mempool, stream-ordered; fences and orderings with events.

    Arena stream keys are :attr:`StreamRef.key`; ``streams`` maps each key in use to its
    :class:`~numba_pool.streams.StreamRef`, which keeps the stream's owner alive.  Each
    non-legacy domain has an event, recorded on its stream whenever one of its blocks is freed
    or a slab is taken on it: another stream taking its blocks waits for that event and never
    touches the stream itself, which its owner may have destroyed by then.
    """

    def __init__(self, pool: MemPool, streams: dict, legacy_key):
        self.pool = pool
        self.streams = streams  # key -> StreamRef
        self.legacy_key = legacy_key
        self.events: dict = {}  # key -> CUevent of a non-legacy domain
        self._fence_event = self._new_event()

    @staticmethod
    def _new_event():
        return check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")

    def record_free(self, stream) -> None:
        """Record the domain's event on ``stream`` (a StreamRef) now; called at each free."""
        key = stream.key
        self.streams[key] = stream
        event = self.events.get(key)
        if event is None:
            event = self.events[key] = self._new_event()
        check(cu.cuEventRecord(event, stream.handle), "cuEventRecord (arena free)")

    def allocate_slab(self, nbytes: int, stream) -> int:
        ref = self.streams[stream]
        ptr = check(cu.cuMemAllocFromPoolAsync(nbytes, self.pool.handle, ref.handle),
                    f"cuMemAllocFromPoolAsync({nbytes}) for an arena slab")
        if stream != self.legacy_key:
            self.record_free(ref)  # the slab's blocks are usable after this point on the stream
        return int(ptr)

    def free_slab(self, address: int, nbytes: int, stream) -> None:
        legacy = self.streams[self.legacy_key].handle
        if stream != self.legacy_key:
            check(cu.cuStreamWaitEvent(legacy, self.events[stream], 0), "cuStreamWaitEvent (arena slab)")
        check(cu.cuMemFreeAsync(cu.CUdeviceptr(address), legacy), "cuMemFreeAsync (arena slab)")

    def fence(self, stream) -> None:
        # One operation on the legacy default stream: it runs after all earlier work of every
        # blocking stream and before all later work (CUDA Runtime API, "stream synchronization
        # behavior", legacy default stream).
        check(cu.cuEventRecord(self._fence_event, self.streams[self.legacy_key].handle), "cuEventRecord (arena fence)")

    def order(self, earlier, later) -> None:
        # cuStreamWaitEvent waits for the event's state at the time of the call, so re-recording
        # an event afterwards does not change what `later` waits for.
        if earlier == self.legacy_key:
            self.fence(earlier)
            event = self._fence_event
        else:
            event = self.events[earlier]
        check(cu.cuStreamWaitEvent(self.streams[later].handle, event, 0), "cuStreamWaitEvent (arena ordering)")

    def forget(self, stream) -> None:
        if stream == self.legacy_key:
            return
        self.streams.pop(stream, None)
        event = self.events.pop(stream, None)
        if event is not None:
            cu.cuEventDestroy(event)  # the driver keeps it until pending waits are done

    def close(self) -> None:
        for event in [self._fence_event, *self.events.values()]:
            cu.cuEventDestroy(event)
        self.events.clear()
