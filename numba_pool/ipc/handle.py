"""The IPC handle of numba_pool memory (the frontend's ``IpcHandle``) and the importer's side:
the exporting pool imported once per process, the pointer imported per handle."""

from __future__ import annotations

import ctypes
import os
import threading
from multiprocessing import reduction

from ..cuda import driver
from ..cuda import frontend as frontends
from ..cuda.driver import check
from ..cuda.frontend import Frontend
from ..cuda.mempool import read_write_access
from .leases import Lease, remove_lease

EXPORT_DATA_BYTES = 64  # sizeof(CUmemPoolPtrExportData)


class ExportData:
    """The 64 bytes of ``CUmemPoolPtrExportData`` (``.reserved``, as Numba's ``CUipcMemHandle.reserved``)."""

    __slots__ = ("reserved",)

    def __init__(self, reserved: bytes):
        if len(reserved) != EXPORT_DATA_BYTES:
            raise ValueError(f"export data must be {EXPORT_DATA_BYTES} bytes, got {len(reserved)}")
        self.reserved = bytes(reserved)

    @classmethod
    def from_driver(cls, data) -> "ExportData":
        return cls(ctypes.string_at(data.getPtr(), EXPORT_DATA_BYTES))

    def to_driver(self, cu):
        data = cu.CUmemPoolPtrExportData()
        ctypes.memmove(data.getPtr(), self.reserved, EXPORT_DATA_BYTES)
        return data


class _ImportedPools:
    """One imported pool per exporting pool in this process, and the devices granted access."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pools: dict = {}  # export key -> (CUmemoryPool, fd); guarded by _lock
        self._granted: set = set()  # (export key, device); guarded by _lock

    def get(self, key: str, fd_source) -> tuple:
        with self._lock:
            found = self._pools.get(key)
            if found is None:
                cu = driver.cu
                fd = receive_fd(fd_source)
                kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                pool = check(cu.cuMemPoolImportFromShareableHandle(fd, kind, 0), "cuMemPoolImportFromShareableHandle")
                found = self._pools[key] = (pool, fd)
            return found

    def grant(self, key: str, pool, device: int) -> None:
        with self._lock:
            if (key, device) in self._granted:
                return
            cu = driver.cu
            check(cu.cuMemPoolSetAccess(pool, [read_write_access(cu, device)], 1),
                  f"cuMemPoolSetAccess(imported pool, device {device})")
            self._granted.add((key, device))


_imported = _ImportedPools()


def receive_fd(source) -> int:
    """This process's copy of the exporter's descriptor from ``source``: an int (ours), ``DupFd``, ``(pid, fd)``."""
    if isinstance(source, int):
        return source
    dupfd, pid, fd = source
    try:
        return dupfd.detach()
    except Exception as err:  # noqa: BLE001 - another authentication key, or the sharer is gone
        try:
            return _pidfd_getfd(pid, fd)
        except OSError as fallback:
            raise RuntimeError(
                f"numba_pool: cannot receive the exporting process's mempool descriptor (pid {pid}): "
                f"multiprocessing refused it ({err!r}) and pidfd_getfd failed ({fallback}); open the handle in a "
                "process started by the exporter's multiprocessing") from None


def _pidfd_getfd(pid: int, fd: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd (x86-64 and aarch64)
        if got < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
        return got
    finally:
        os.close(pidfd)


class PoolIpcHandle:
    """Mixin for a frontend's ``IpcHandle`` (:func:`handle_class`), ``handle`` an :class:`ExportData`; its pickle
    carries it, size and offset (bytes), source device, pool key and descriptor, lease, exporter's frontend (the
    importer uses its own: :func:`_rebuild`).  ``open``/``open_array`` (direct if the device reaches the source,
    else staged), ``open_direct``, ``open_staged``, ``IpcArrayHandle`` open it; ``close`` frees the import."""

    frontend: Frontend  # set by handle_class

    def __init__(self, base, handle, size, source_info=None, offset=0, *, pool_key: str, fd, lease: Lease):
        super().__init__(base, handle, size, source_info, offset)
        self.pool_key, self._fd, self.lease = pool_key, fd, lease

    def __reduce__(self):
        fd = self._fd
        if isinstance(fd, int):  # ours (the exporter's, or imported here): share a duplicate
            fd = (reduction.DupFd(fd), os.getpid(), fd)
        return (_rebuild, (self.handle.reserved, self.size, self.source_info, self.offset,
                           self.pool_key, fd, self.lease.folder, self.lease.export, self.frontend.name))

    def _import(self, device: int):
        """Import the pointer here, ``device`` able to reach it; returns ``(CUdeviceptr, lease file)``."""
        pool, fd = _imported.get(self.pool_key, self._fd)
        self._fd = fd
        if self.frontend.driver.Device.from_identity(self.source_info).id != device:
            _imported.grant(self.pool_key, pool, device)
        lease = self.lease.take()
        try:
            cu = driver.cu
            ptr = check(cu.cuMemPoolImportPointer(pool, self.handle.to_driver(cu)), "cuMemPoolImportPointer")
        except BaseException:
            remove_lease(lease)
            raise
        return ptr, lease

    def open_direct(self, context):
        """Import into ``context`` (its device must reach the source): a ``MemoryPointer`` of ``size`` bytes.
        :raises ValueError: in the exporting process, or when already open (Numba's messages)."""
        if self.base is not None:
            raise ValueError("opening IpcHandle from original process")
        if self._impl is not None:
            raise ValueError("IpcHandle is already opened")
        ptr, lease = self._import(context.device.id)
        # Kept here: own() holds only a weak proxy of it (as Numba's _CudaIpcImpl keeps _opened_mem).
        opened = _Opened(ptr, lease, self.frontend.MemoryPointer(context, ptr, size=self.offset + self.size))
        self._impl = opened
        return opened.memory.own().view(self.offset)

    def open_staged(self, context):
        """Without peer access: import on the source, copy ``size`` bytes to new ``context`` memory, free the import.
        :raises ValueError: when already open."""
        cuda, numba_driver = self.frontend.cuda, self.frontend.driver
        self._sentry_source_info()
        if self._impl is not None:
            raise ValueError("IpcHandle is already opened")
        source_device = numba_driver.Device.from_identity(self.source_info).id
        with cuda.gpus[source_device]:
            source_context = cuda.devices.get_context()
            ptr, lease = self._import(source_device)
            opened = _Opened(ptr, lease, self.frontend.MemoryPointer(source_context, ptr,
                                                                     size=self.offset + self.size))
        copy = context.memalloc(self.size)
        numba_driver.device_to_device(copy, opened.memory.view(self.offset), self.size)
        with cuda.gpus[source_device]:
            opened.close()
        self._impl = _Staged()
        return copy

    def close(self) -> None:
        """Free the imported memory (after work on the legacy stream that uses it) and give the lease back.
        :raises ValueError: when not open (Numba's message)."""
        if self._impl is None:
            raise ValueError("IpcHandle not opened")
        impl, self._impl = self._impl, None
        impl.close()


class _Opened:
    """An imported pointer, the ``MemoryPointer`` over it and the lease taken for it."""

    def __init__(self, ptr, lease: str, memory):
        self.ptr, self.lease, self.memory = ptr, lease, memory

    def close(self) -> None:
        cu = driver.cu
        legacy = cu.CUstream(cu.CU_STREAM_LEGACY)
        check(cu.cuMemFreeAsync(self.ptr, legacy), "cuMemFreeAsync (imported)")
        check(cu.cuStreamSynchronize(legacy), "cuStreamSynchronize")  # the free completes first
        remove_lease(self.lease)


class _Staged:
    def close(self) -> None:
        pass  # the copy belongs to the importer's manager; the import was freed at open


_handle_classes: dict = {}  # frontend name -> its handle class (a dict store is atomic)


def handle_class(frontend: Frontend) -> type:
    """:class:`PoolIpcHandle` on ``frontend``'s ``IpcHandle``."""
    cls = _handle_classes.get(frontend.name)
    if cls is None:
        cls = _handle_classes.setdefault(frontend.name, frontend.derive(PoolIpcHandle, frontend.IpcHandle))
    return cls


def _importer_frontend(exporter: str):
    """An unpickled handle's frontend: the importer's; the exporter's if in use here, or none is and tools pick it."""
    in_use = frontends.imported()
    if exporter in in_use or not in_use and exporter in frontends.installed():
        return frontends.load(exporter)
    return frontends.load(in_use[0]) if in_use else frontends.for_tools()


def _rebuild(reserved, size, source_info, offset, pool_key, fd, folder, export,
             exporter: str = frontends.NUMBA_CUDA) -> PoolIpcHandle:
    cls = handle_class(_importer_frontend(exporter))
    return cls(None, ExportData(reserved), size, source_info, offset, pool_key=pool_key, fd=fd,
               lease=Lease(folder, export))
