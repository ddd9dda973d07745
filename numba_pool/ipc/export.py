"""The exporter's side of IPC: an export's data (``cuMemPoolExportPointer``) and its handle."""

from __future__ import annotations

import itertools
import os

from ..cuda.driver import check
from .handle import ExportData, PoolIpcHandle, handle_class
from .leases import Lease, LeaseHold, LeaseQueue, lease_folder

_export_ids = itertools.count(1)


def export(allocator, memory, source_info, frontend, leases: LeaseQueue) -> PoolIpcHandle:
    """The plugin's ``get_ipc_handle``: a handle for ``memory`` (a ``MemoryPointer`` or view), its block held from reuse
    while importers claim it.  ``source_info``: the device's identity (``Device.get_device_identity()``); ``frontend``:
    the exporting manager's (its ``IpcHandle`` the base); ``leases``: the process's lease queue.  :raises ValueError:
    when ``memory`` is not in a live numba_pool allocation of this device.  :raises RuntimeError: when the pool cannot
    be exported, with the reason.  :raises CudaAPIError: when ``cuMemPoolExportPointer`` fails."""
    cu, pool = allocator.cu, allocator.pool
    address = int(memory.device_pointer_value)
    found = allocator.allocation_of(address)
    if found is None:
        raise ValueError(f"numba_pool.get_ipc_handle: address {address:#x} is not in a live allocation of "
                         f"numba_pool on device {pool.device_id}")
    fd = pool.export_fd()
    base, _ = found
    data = check(cu.cuMemPoolExportPointer(cu.CUdeviceptr(base)), "cuMemPoolExportPointer")
    lease = Lease(lease_folder(), f"{os.getpid()}-{next(_export_ids)}")
    # Found above: only a release racing the export misses it, or a PyTorch tensor's block its door kept
    # after PyTorch freed it (released now: Note [The doors' free lists]).  The synchronize in
    # export_hold orders the block's previous owners before the importer, which orders against nothing here.
    if not allocator.export_hold(address, LeaseHold(lease, leases)):  # (no importer has its lease yet)
        raise ValueError(f"numba_pool.get_ipc_handle: address {address:#x} is not in a live allocation of "
                         f"numba_pool on device {pool.device_id} (its tensor was freed)")
    return handle_class(frontend)(memory, ExportData.from_driver(data), memory.size, source_info,
                                  offset=address - base, pool_key=pool.export_key, fd=fd, lease=lease)


