"""One device's CUDA stream-ordered memory pool (CUDA Driver API, "Stream Ordered Memory Allocator"): a private one
(``cuMemPoolCreate``, capped by ``CUmemPoolProps.maxSize`` if asked) or the device's default
(``cuDeviceGetDefaultMemPool``, shared with CuPy's and PyTorch's ``cudaMallocAsync``).  Here: creation, attributes,
trimming, destruction; the allocator calls ``cuMemAllocFromPoolAsync``/``cuMemFreeAsync`` on ``MemPool.handle``."""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass

from cuda.bindings import driver as cuda_driver

from ..config import PoolConfig
from . import driver as _driver
from .capture import relaxed
from .driver import check

_ATTR = cuda_driver.CUmemPool_attribute


@dataclass(frozen=True)
class PoolUsage:
    """The pool's accounting in bytes (``CU_MEMPOOL_ATTR_*``): *reserved* (mapped), *used* (handed out until a
    stream-ordered free is issued) and their high watermarks since creation or :meth:`MemPool.reset_high_watermarks`."""

    reserved: int
    reserved_high: int
    used: int
    used_high: int


class MemPool:
    """The mempool serving one device.  :param cu: the driver object (:mod:`numba_pool.cuda.driver`).
    :param device_id: CUDA device ordinal.  :param device_total: total memory (bytes, for a fractional ``max_size``).
    :param config: the options; ``use_default_pool``, ``max_size`` and ``release_threshold`` apply here.
    :raises CudaAPIError: when the driver refuses to create or configure the pool."""

    def __init__(self, cu, device_id: int, config: PoolConfig, device_total: int):
        self._cu = cu
        self.device_id = device_id
        self.is_private = not config.use_default_pool
        self.max_size = config.max_size_bytes(device_total) if self.is_private else None
        self.exportable, self.not_exportable_because = False, "the device's default mempool is not exportable"
        self._export_fd: int | None = None
        self._export_lock = threading.Lock()
        if self.is_private:
            props = cu.CUmemPoolProps()
            props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            props.handleTypes = self._handle_types(config.ipc)
            props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            props.location.id = device_id
            props.maxSize = self.max_size or 0
            self.handle = check(cu.cuMemPoolCreate(props), "cuMemPoolCreate")
        else:
            self.handle = check(cu.cuDeviceGetDefaultMemPool(cu.CUdevice(device_id)), "cuDeviceGetDefaultMemPool")
        self.set_release_threshold(config.release_threshold)
        self.forbid_internal_dependencies()
        self.peers = self.grant_peer_access() if config.peer_access == "all" else []

    def _handle_types(self, wanted: bool):
        """Sets :attr:`exportable`, why not: ``CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`` if IPC is wanted and supported
        (``CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES``; not WSL2), else ``CU_MEM_HANDLE_TYPE_NONE``."""
        cu = self._cu
        kinds = cu.CUmemAllocationHandleType
        if not wanted:
            self.not_exportable_because = "NUMBA_POOL_IPC is off"
            return kinds.CU_MEM_HANDLE_TYPE_NONE
        attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES
        supported = int(check(cu.cuDeviceGetAttribute(attr, cu.CUdevice(self.device_id)),
                              "cuDeviceGetAttribute(MEMPOOL_SUPPORTED_HANDLE_TYPES)"))
        fd = kinds.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        if not supported & int(fd):
            self.not_exportable_because = (f"device {self.device_id}'s mempools support no POSIX file descriptor "
                                           f"handles (supported handle types: {supported:#x}; WSL2 has none)")
            return kinds.CU_MEM_HANDLE_TYPE_NONE
        self.exportable, self.not_exportable_because = True, ""
        return fd

    def grant_peer_access(self) -> list[int]:
        """Let every device that can reach this one (``cuDeviceCanAccessPeer``) read and write the pool's
        memory (``cuMemPoolSetAccess``, ``PROT_READWRITE``), as for ``cuMemAlloc`` memory; returns them."""
        cu = self._cu
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        peers = [d for d in range(int(count)) if d != self.device_id
                 and check(cu.cuDeviceCanAccessPeer(cu.CUdevice(d), cu.CUdevice(self.device_id)), "cuDeviceCanAccessPeer")]
        if peers:
            descs = [read_write_access(cu, d) for d in peers]
            check(cu.cuMemPoolSetAccess(self.handle, descs, len(descs)), f"cuMemPoolSetAccess(peers {peers})")
        return peers

    def export_fd(self) -> int:
        """The pool's POSIX file descriptor for other processes (``cuMemPoolExportToShareableHandle``), one per pool.
        :raises RuntimeError: when the pool is not exportable (the reason is in the message)."""
        if not self.exportable:
            raise RuntimeError(f"numba_pool: device {self.device_id}'s mempool cannot be shared with other "
                               f"processes: {self.not_exportable_because}")
        if self._export_fd is None:
            with self._export_lock:  # the first export once, whatever the threads
                if self._export_fd is None:
                    kind = self._cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                    fd = int(check(self._cu.cuMemPoolExportToShareableHandle(self.handle, kind, 0),
                                   "cuMemPoolExportToShareableHandle"))
                    # names the pool in importers' caches (handles, fds get reused); set before the fd is published
                    self.export_key = f"{os.getpid()}-{uuid.uuid4().hex}"
                    self._export_fd = fd
        return self._export_fd

    def set_release_threshold(self, nbytes: int) -> None:
        """Reserved bytes kept at a synchronize (``CU_MEMPOOL_ATTR_RELEASE_THRESHOLD``; ``config.KEEP_ALL``: all)."""
        check(self._cu.cuMemPoolSetAttribute(self.handle, _ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, self._cu.cuuint64_t(nbytes)),
              "cuMemPoolSetAttribute(RELEASE_THRESHOLD)")

    def forbid_internal_dependencies(self) -> None:
        """Turn ``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`` off: allocations never wait for other streams'
        work, so the private allocation stream gets idle memory (rule 4); on the default pool, for all its users."""
        check(self._cu.cuMemPoolSetAttribute(self.handle, _ATTR.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0),
              "cuMemPoolSetAttribute(REUSE_ALLOW_INTERNAL_DEPENDENCIES)")

    def _get(self, attr) -> int:
        # In relaxed capture mode: the driver refuses a pool attribute read as "potentially unsafe" in the calling
        # thread's default (global) mode while a global-mode capture runs, any thread's, numba_pool's or another
        # library's (docs/perf-notes.md, "Stream capture: what the driver allows").
        with relaxed(self._cu):
            result = self._cu.cuMemPoolGetAttribute(self.handle, attr)
        return int(check(result, f"cuMemPoolGetAttribute({attr.name})"))

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
            with relaxed(self._cu):  # as _get's reads (not measured in a capture; the read was refused there)
                result = self._cu.cuMemPoolSetAttribute(self.handle, attr, self._cu.cuuint64_t(0))
            check(result, f"cuMemPoolSetAttribute({attr.name})")

    def trim(self, keep_bytes: int = 0) -> None:
        """Trim to ``keep_bytes`` (``cuMemPoolTrimTo``), keeping what incomplete frees hold (synchronize first)."""
        check(self._cu.cuMemPoolTrimTo(self.handle, keep_bytes), "cuMemPoolTrimTo")

    def reserve(self, nbytes: int) -> None:
        """Grow the reserve to >= ``nbytes`` (seeds' pre-allocation): allocate, free, wait; kept under the threshold."""
        if nbytes <= 0:
            return
        cu = self._cu
        stream = cu.CUstream(cu.CU_STREAM_LEGACY)
        ptr = check(cu.cuMemAllocFromPoolAsync(nbytes, self.handle, stream), f"cuMemAllocFromPoolAsync({nbytes})")
        check(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def destroy(self) -> None:
        """Destroy a private pool (``cuMemPoolDestroy``: freed after its allocations) or trim the default to 0."""
        if self._export_fd is not None:
            os.close(self._export_fd)
            self._export_fd = None
        if self.is_private:
            check(self._cu.cuMemPoolDestroy(self.handle), "cuMemPoolDestroy")
        else:
            self.trim(0)


def concurrent_managed_access(cu, device_id: int) -> bool:
    """``CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS``: 1 on Pascal and later under Linux; 0 on Windows/WSL
    and older devices, where the host must not touch managed memory during a kernel (Numba then serves it)."""
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
    return bool(check(cu.cuDeviceGetAttribute(attr, cu.CUdevice(device_id)),
                      "cuDeviceGetAttribute(CONCURRENT_MANAGED_ACCESS)"))


def is_managed(pointer: int, cu=None) -> bool:
    """Whether an address is managed (``CU_POINTER_ATTRIBUTE_IS_MANAGED``), False for unknown memory."""
    cu = _driver.cu if cu is None else cu
    attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED
    err, value = cu.cuPointerGetAttribute(attr, pointer)
    return err == _driver.SUCCESS and bool(value)


def prefetch(cu, address: int, nbytes: int, device: int | None, stream) -> None:
    """Migrate managed memory ``[address, address + nbytes)`` to ``device`` (an ordinal) or the host (None), in order on
    ``stream``: ``cuMemPrefetchAsync``, CUDA 13's ``CUmemLocation`` form.  :raises CudaAPIError: when the driver refuses
    (not managed: ``CUDA_ERROR_INVALID_VALUE``; no concurrent managed access: ``CUDA_ERROR_INVALID_DEVICE``)."""
    location = cu.CUmemLocation()
    if device is None:
        location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
    else:
        location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = device
    where = "the host" if device is None else f"device {device}"
    check(cu.cuMemPrefetchAsync(cu.CUdeviceptr(address), nbytes, location, 0, stream),
          f"cuMemPrefetchAsync({nbytes} bytes at {address:#x} to {where})")


def read_write_access(cu, device: int):
    """A ``CUmemAccessDesc`` giving ``device`` read and write access (``cuMemPoolSetAccess``)."""
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


def device_memory_info(cu=None) -> tuple[int, int]:
    """(free, total) bytes of the current context's device (``cuMemGetInfo``); ``cu`` defaults to :data:`.driver.cu`."""
    cu = _driver.cu if cu is None else cu
    return check(cu.cuMemGetInfo(), "cuMemGetInfo")


def pointer_mempool(pointer: int, cu=None) -> int:
    """The mempool handle (int) of an address, 0 if none (``CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE``)."""
    cu = _driver.cu if cu is None else cu
    attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
    return int(check(cu.cuPointerGetAttribute(attr, pointer), "cuPointerGetAttribute(MEMPOOL_HANDLE)"))
