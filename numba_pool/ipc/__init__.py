"""IPC of numba_pool memory: handles other processes open, through the mempool's own path (``cuIpcGetMemHandle``
refuses mempool memory; CUDA Driver API, "Stream Ordered Memory Allocator": interprocess communication):

* the pool is exportable (``CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR``, :mod:`numba_pool.cuda.mempool`);
* the exporter exports the pool once (``cuMemPoolExportToShareableHandle``: a descriptor) and each allocation's
  base (``cuMemPoolExportPointer``: 64 bytes; the driver refuses interior pointers) plus an offset;
* the importer imports the pool once (``cuMemPoolImportFromShareableHandle``), grants access if needed
  (``cuMemPoolSetAccess``), imports the pointer (``cuMemPoolImportPointer``); ``close()``: ``cuMemFreeAsync``.

The descriptor travels in the pickle as a :class:`multiprocessing.reduction.DupFd` (``SCM_RIGHTS`` over a Unix socket);
without the exporter's authentication key, ``pidfd_getfd`` (needs the right to trace the exporter).  Lifetimes: an
import must be freed before the exporter frees it.  Opening a handle leaves a *lease* file naming the export and the
importer's pid (in :func:`.leases.lease_folder`), which ``close()`` removes.  An export registers a *hold* on its block
(:meth:`~.device.DeviceAllocator.hold`, rule 2): the released block waits while a living importer's lease exists (a
daemon thread checks every 50 ms; dead importers' leases go).  Statistics and log count the array freed at once, the
pool's used bytes only then.  As with Numba's IPC, the exporter keeps the array alive until all importers opened it."""


from .export import export
from .handle import EXPORT_DATA_BYTES, ExportData, PoolIpcHandle, receive_fd
from .leases import LEASE_CHECK_S, Lease, LeaseHold, LeaseQueue, lease_folder

__all__ = ["EXPORT_DATA_BYTES", "ExportData", "LEASE_CHECK_S", "Lease", "LeaseHold", "LeaseQueue", "PoolIpcHandle",
           "export", "lease_folder", "receive_fd"]
