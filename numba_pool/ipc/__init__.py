"""IPC of numba_pool memory: handles that other processes open, through the mempool's own path.

``cuIpcGetMemHandle`` refuses mempool memory.  CUDA's path for it (CUDA Driver API, "Stream
Ordered Memory Allocator": interprocess communication):

* the pool is created exportable (``CUmemPoolProps.handleTypes =
  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR``, :class:`numba_pool.cuda.mempool.MemPool`);
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
process id, and ``close()`` removes it.  An export registers a *hold* on its block with the
device allocator (:meth:`numba_pool.allocator.device.DeviceAllocator.hold`, rule 2 of the
stream rule): when the exporter releases the array (it is dropped, or ``free()``), the block is
not reused while a lease of a living importer exists (checked every 50 ms by a daemon thread).
The array counts as freed in the statistics and the allocation log at once; the pool's used
bytes keep the block until the leases go.  An importer that exits without closing leaves a
lease whose process is gone: the driver has freed its imports, and the lease is removed at the
next check.  What the exporter must do, as with Numba's own IPC: keep the exported array (or
its handle) alive until every importer has opened it.

Modules: :mod:`.leases` (the lease files and the hold), :mod:`.export` (the exporter's side),
:mod:`.handle` (the handle and the importer's side).
"""


from .export import export
from .handle import EXPORT_DATA_BYTES, ExportData, PoolIpcHandle, receive_fd
from .leases import LEASE_CHECK_S, Lease, LeaseHold, LeaseQueue, lease_folder

__all__ = ["EXPORT_DATA_BYTES", "ExportData", "LEASE_CHECK_S", "Lease", "LeaseHold", "LeaseQueue", "PoolIpcHandle",
           "export", "lease_folder", "receive_fd"]
