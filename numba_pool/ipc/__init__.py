"""IPC of numba_pool memory: handles other processes open, through the mempool's own path
(``cuIpcGetMemHandle`` refuses mempool memory; CUDA Driver API, "Stream Ordered Memory
Allocator": interprocess communication):

* the pool is exportable (``CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR``, :mod:`numba_pool.cuda.mempool`);
* the exporter exports the pool once (``cuMemPoolExportToShareableHandle``: a descriptor) and
  each allocation (``cuMemPoolExportPointer``: 64 bytes); the driver refuses interior pointers,
  so a slice, arena block or scratch array exports its mempool allocation's base and an offset;
* the importer imports the pool once (``cuMemPoolImportFromShareableHandle``), grants its device
  access if needed (``cuMemPoolSetAccess``) and imports the pointer (``cuMemPoolImportPointer``);
  ``close()`` frees the import (``cuMemFreeAsync``, completed before it returns).

The descriptor travels in the pickled handle as a :class:`multiprocessing.reduction.DupFd`
(``SCM_RIGHTS`` over a Unix socket); a process without the exporter's authentication key falls
back to ``pidfd_getfd``, which needs the right to trace the exporter.

Lifetimes: importers must free an import before the exporter frees it.  Opening a handle leaves a *lease* file
(``/dev/shm``, else the temporary folder) naming the export and the importer's pid; ``close()`` removes it.
An export registers a *hold* on its block (:meth:`numba_pool.allocator.device.DeviceAllocator.hold`, rule 2):
the released block is not reused while a living importer's lease exists (a daemon thread checks every 50 ms; a
dead importer's lease is removed).  The array counts as freed in the statistics and the log at once; the
pool's used bytes keep it until then.  As with Numba's IPC, the exporter keeps the array alive until every
importer has opened it.  Modules: :mod:`.leases`, :mod:`.export`, :mod:`.handle`."""


from .export import export
from .handle import EXPORT_DATA_BYTES, ExportData, PoolIpcHandle, receive_fd
from .leases import LEASE_CHECK_S, Lease, LeaseHold, LeaseQueue, lease_folder

__all__ = ["EXPORT_DATA_BYTES", "ExportData", "LEASE_CHECK_S", "Lease", "LeaseHold", "LeaseQueue", "PoolIpcHandle",
           "export", "lease_folder", "receive_fd"]
