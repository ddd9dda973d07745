"""IPC of numba_pool memory: handles that other processes open, through the mempool's own path.

``cuIpcGetMemHandle`` refuses mempool memory.  CUDA's path for it (CUDA Driver API, "Stream
Ordered Memory Allocator": interprocess communication):

* the pool is created exportable (``CUmemPoolProps.handleTypes =
  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR``, :class:`numba_pool.mempool.MemPool`);
* the exporter exports the pool once (``cuMemPoolExportToShareableHandle``: a file descriptor)
  and each allocation (``cuMemPoolExportPointer``: 64 bytes of export data).  The driver
  refuses interior pointers, so a slice, an arena block or a scratch array exports the base of
  its mempool allocation (the slab, for the arena) and carries its offset;
* the importer imports the pool once per exporting pool (``cuMemPoolImportFromShareableHandle``),
  lets its device reach it when that is not the pool's device (``cuMemPoolSetAccess``), and
  imports the pointer (``cuMemPoolImportPointer``); ``close()`` frees the import
  (``cuMemFreeAsync``, completed before ``close`` returns).

The descriptor travels inside the pickled handle as a :class:`multiprocessing.reduction.DupFd`:
passed to a process that ``multiprocessing`` starts, or through its queues and pipes, the
standard library sends it over a Unix socket (``SCM_RIGHTS``); a process that does not share
the exporter's ``multiprocessing`` authentication key falls back to ``pidfd_getfd``, which
needs the right to trace the exporter (same user and ``kernel.yama.ptrace_scope`` 0, or root).

Lifetimes.  The driver's rule is that importers free an imported allocation before the
exporter frees it.  numba_pool keeps it with *leases*: opening a handle leaves a small file in
the lease folder (``/dev/shm``, else the temporary folder) naming the export and the importer's
process id, and ``close()`` removes it.  When the exporter releases an exported array (it is
dropped, or ``free()``), the release waits while a lease of a living importer exists (checked
every 50 ms by a daemon thread), so the memory is not reused while any importer holds it.  An
importer that exits without closing leaves a lease whose process is gone: the driver has freed
its imports, and the lease is removed at the next check.  What the exporter must do, as with
Numba's own IPC: keep the exported array (or its handle) alive until every importer has opened
it.  Arrays reached through a foreign object (the CUDA Array Interface) are exported too, but
their release is not held back: keep them alive until the importers have closed.
"""

from __future__ import annotations

import ctypes
import glob
import itertools
import os
import tempfile
import threading
import time
from multiprocessing import reduction

from numba.cuda.cudadrv.driver import IpcHandle, MemoryPointer

from . import driver
from .driver import check
from .mempool import read_write_access
from .pointer import PoolPointer

EXPORT_DATA_BYTES = 64  # sizeof(CUmemPoolPtrExportData)
LEASE_CHECK_S = 0.05


class ExportData:
    """The 64 bytes of ``CUmemPoolPtrExportData`` (``.reserved``, as Numba's handles expose
    ``CUipcMemHandle.reserved``)."""

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


# -- exporting --------------------------------------------------------------------------------

_export_ids = itertools.count(1)


def export(manager, memory) -> "PoolIpcHandle":
    """An IPC handle for ``memory`` (a numba_pool ``MemoryPointer`` or a view of one): the
    EMM plugin's ``get_ipc_handle``.

    :raises ValueError: when ``memory`` is not in a live numba_pool allocation of this device.
    :raises RuntimeError: when the pool cannot be exported (IPC off, the device's default
        mempool, or no POSIX file descriptor support), with the reason.
    :raises CudaAPIError: when ``cuMemPoolExportPointer`` fails.
    """
    cu = manager._pool._cu
    address = int(memory.device_pointer_value)
    found = manager._ordering.allocation_of(address)
    if found is None:
        raise ValueError(f"numba_pool.get_ipc_handle: address {address:#x} is not in a live allocation of "
                         f"numba_pool on device {manager.device_id}")
    pool = manager._pool
    fd = pool.export_fd()
    base, _ = found
    data = check(cu.cuMemPoolExportPointer(cu.CUdeviceptr(base)), "cuMemPoolExportPointer")
    lease = Lease(lease_folder(), f"{os.getpid()}-{next(_export_ids)}")
    _hold_while_leased(memory, lease)
    return PoolIpcHandle(memory, ExportData.from_driver(data), memory.size,
                         manager.context.device.get_device_identity(), offset=address - base,
                         pool_key=pool.export_key, fd=fd, lease=lease)


def lease_folder() -> str:
    """Where leases live: ``/dev/shm`` (memory, gone at reboot) when writable, else the
    temporary folder."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class Lease:
    """The importers' claims on one export: files ``numba_pool-ipc-<export>-<pid>-<n>`` in
    ``folder``."""

    _opened = itertools.count(1)

    def __init__(self, folder: str, export: str):
        self.folder, self.export = folder, export

    def take(self) -> str:
        """An importer's claim (this process): returns the file to give back."""
        path = os.path.join(self.folder, f"numba_pool-ipc-{self.export}-{os.getpid()}-{next(self._opened)}")
        with open(path, "x"):
            pass
        return path

    def held(self) -> bool:
        """Whether a living process holds a claim; the claims of dead ones are removed."""
        held = False
        for path in glob.glob(os.path.join(self.folder, f"numba_pool-ipc-{self.export}-*")):
            pid = int(path.rsplit("-", 2)[-2])
            if _alive(pid):
                held = True
            else:
                _remove(path)
        return held


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _LeasedRelease:
    """A PoolPointer's release that waits for its exports' leases to go."""

    def __init__(self, release, lease: Lease):
        self.release, self.leases = release, [lease]

    def __call__(self) -> None:  # from a finalizer: never raises
        if any(lease.held() for lease in self.leases):
            _deferred.add(self)
        else:
            self.release()


def _hold_while_leased(memory, lease: Lease) -> None:
    owner = memory.owner
    if not isinstance(owner, PoolPointer) or owner._release is None:
        return  # a foreign object's memory: the module docstring says what to do
    release = owner._release
    if isinstance(release, _LeasedRelease):
        release.leases.append(lease)
    else:
        owner._release = _LeasedRelease(release, lease)


class _Deferred:
    """Exported arrays released while importers hold them; a daemon thread retries them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: list[_LeasedRelease] = []  # guarded by _lock
        self._thread: threading.Thread | None = None

    def add(self, release: _LeasedRelease) -> None:
        with self._lock:
            self._pending.append(release)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="numba_pool-ipc-leases", daemon=True)
                self._thread.start()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            time.sleep(LEASE_CHECK_S)
            with self._lock:
                pending = list(self._pending)
            due = [r for r in pending if not any(lease.held() for lease in r.leases)]  # files: no lock
            with self._lock:
                self._pending = [r for r in self._pending if r not in due]
                finished = not self._pending
                if finished:
                    self._thread = None
            for release in due:
                release.release()
            if finished:
                return


_deferred = _Deferred()


# -- importing --------------------------------------------------------------------------------

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
                fd = _receive_fd(fd_source)
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


def _receive_fd(source) -> int:
    """This process's copy of the exporter's pool descriptor: ``source`` is an int (ours
    already), a ``DupFd`` (``multiprocessing``), or ``(pid, fd)`` for ``pidfd_getfd``."""
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


class PoolIpcHandle(IpcHandle):
    """Numba's ``IpcHandle`` for numba_pool memory: ``handle`` is :class:`ExportData`; the
    pickled form carries it, the size and offset in bytes, the source device's identity, the
    exporting pool's key and descriptor, and the lease.  Opened by ``open``/``open_array``
    (direct where the device can reach the source device, else staged through a copy),
    ``open_direct``, ``open_staged``, and ``IpcArrayHandle``; ``close`` frees the import.
    """

    def __init__(self, base, handle, size, source_info=None, offset=0, *, pool_key: str, fd, lease: Lease):
        super().__init__(base, handle, size, source_info, offset)
        self.pool_key, self._fd, self.lease = pool_key, fd, lease

    def __reduce__(self):
        fd = self._fd
        if isinstance(fd, int):  # ours (the exporter's, or imported here): share a duplicate
            fd = (reduction.DupFd(fd), os.getpid(), fd)
        return (_rebuild, (self.handle.reserved, self.size, self.source_info, self.offset,
                           self.pool_key, fd, self.lease.folder, self.lease.export))

    def _import(self, device: int):
        """Import the pointer into this process with ``device`` able to reach it; returns the
        pointer (``CUdeviceptr``) and the lease file."""
        from numba.cuda.cudadrv.driver import Device

        pool, fd = _imported.get(self.pool_key, self._fd)
        self._fd = fd
        if Device.from_identity(self.source_info).id != device:
            _imported.grant(self.pool_key, pool, device)
        lease = self.lease.take()
        try:
            cu = driver.cu
            ptr = check(cu.cuMemPoolImportPointer(pool, self.handle.to_driver(cu)), "cuMemPoolImportPointer")
        except BaseException:
            _remove(lease)
            raise
        return ptr, lease

    def open_direct(self, context):
        """Import the memory into ``context`` (whose device must reach the source device);
        returns a ``MemoryPointer`` of ``size`` bytes.

        :raises ValueError: in the exporting process, or when already open (Numba's messages).
        """
        if self.base is not None:
            raise ValueError("opening IpcHandle from original process")
        if self._impl is not None:
            raise ValueError("IpcHandle is already opened")
        ptr, lease = self._import(context.device.id)
        # The opened pointer is kept here: own() holds only a weak proxy of it (as Numba's
        # _CudaIpcImpl keeps _opened_mem).
        opened = _Opened(ptr, lease, MemoryPointer(context, ptr, size=self.offset + self.size))
        self._impl = opened
        return opened.memory.own().view(self.offset)

    def open_staged(self, context):
        """Import on the source device, copy ``size`` bytes into new memory of ``context``,
        free the import: for devices that cannot reach each other.

        :raises ValueError: when already open.
        """
        from numba import cuda
        from numba.cuda.cudadrv.driver import Device, device_to_device

        self._sentry_source_info()
        if self._impl is not None:
            raise ValueError("IpcHandle is already opened")
        source_device = Device.from_identity(self.source_info).id
        with cuda.gpus[source_device]:
            source_context = cuda.devices.get_context()
            ptr, lease = self._import(source_device)
            opened = _Opened(ptr, lease, MemoryPointer(source_context, ptr, size=self.offset + self.size))
        copy = context.memalloc(self.size)
        device_to_device(copy, opened.memory.view(self.offset), self.size)
        with cuda.gpus[source_device]:
            opened.close()
        self._impl = _Staged()
        return copy

    def close(self) -> None:
        """Free the imported memory (after work on the legacy stream that uses it) and give the
        lease back.

        :raises ValueError: when not open (Numba's message).
        """
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
        _remove(self.lease)


class _Staged:
    def close(self) -> None:
        pass  # the copy belongs to the importer's manager; the import was freed at open


def _rebuild(reserved, size, source_info, offset, pool_key, fd, folder, export) -> PoolIpcHandle:
    return PoolIpcHandle(None, ExportData(reserved), size, source_info, offset,
                         pool_key=pool_key, fd=fd, lease=Lease(folder, export))
