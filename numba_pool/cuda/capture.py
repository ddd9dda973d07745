"""CUDA-graph stream capture, through cuda-python: whether a stream is being captured, the thread's capture mode,
the device's graph memory (cost of these queries: Note [Capture queries]).  What the driver allows in a capture
(docs/perf-notes.md, "Stream capture"; H100, driver 580), whence the rules of :mod:`numba_pool.allocator.captures`:

* on the capturing stream, pool allocation and free become graph nodes (from a non-exportable pool only:
  ``CUDA_ERROR_NOT_SUPPORTED`` otherwise); ``cuStreamGetId`` invalidates the capture;
* while a blocking stream captures, no legacy-stream use (``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT``), any mode/thread;
* ``cuCtxSynchronize``, ``cuStreamSynchronize`` and ``cuMemPoolTrimTo`` invalidate any capture;
* a *global-mode* capture is invalidated from any thread by ``cuEventQuery``, ``cuStreamSynchronize`` and pool
  allocation/free on other streams, unless the caller's mode is relaxed (``cuThreadExchangeStreamCaptureMode``);
* event records, ``cuStreamWaitEvent`` on other streams, and ``cuMemGetInfo`` are allowed."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from cuda.bindings import driver as cuda_driver

from .driver import SUCCESS, check

_ACTIVE = cuda_driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
_NONE = NOT_CAPTURING = cuda_driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE  #: cuStreamIsCapturing's no
_RELAXED = cuda_driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED


def is_capturing(cu, handle) -> bool:
    """Whether stream ``handle`` (``CUstream``) is capturing, or was and the invalidated capture is still to be
    ended (``cuStreamIsCapturing``); a stream the driver won't answer for (destroyed, another context's) is not."""
    err, status = cu.cuStreamIsCapturing(handle)
    return err == SUCCESS and status != _NONE


def capture_id(cu, handle) -> int:
    """The id of the capture sequence under way on ``handle`` (unique for the life of the process,
    ``cuStreamGetCaptureInfo``), 0 when none is; an invalidated capture keeps its id until it is ended."""
    result = cu.cuStreamGetCaptureInfo(handle)
    if result[0] != SUCCESS or result[1] == _NONE:
        return 0
    return int(result[2])


@contextlib.contextmanager
def relaxed(cu) -> Iterator[None]:
    """The calling thread in relaxed capture mode for the block (``cuThreadExchangeStreamCaptureMode``, restored
    after): its stream-ordered allocations and frees on uncaptured streams, and event queries, are allowed during
    another thread's global capture; conflicting calls stay forbidden."""
    err, previous = cu.cuThreadExchangeStreamCaptureMode(_RELAXED)
    try:
        yield
    finally:
        if err == SUCCESS:
            cu.cuThreadExchangeStreamCaptureMode(previous)


@dataclass(frozen=True)
class GraphMemory:
    """A device's graph memory (CUDA graphs' allocation nodes', apart from every mempool; in bytes,
    ``cuDeviceGetGraphMemAttribute``): ``used`` now, ``reserved`` by the driver, and their high watermarks."""

    used: int = 0
    used_high: int = 0
    reserved: int = 0
    reserved_high: int = 0


def graph_memory(cu, device_id: int) -> GraphMemory:
    """Device ``device_id``'s graph memory (:class:`GraphMemory`); zeros where the driver does
    not answer (no graph has allocated yet on some drivers, or a stand-in driver)."""
    get = getattr(cu, "cuDeviceGetGraphMemAttribute", None)
    if get is None:
        return GraphMemory()
    names = ("CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT", "CU_GRAPH_MEM_ATTR_USED_MEM_HIGH",
             "CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT", "CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH")
    values = []
    for name in names:
        err, value = get(cu.CUdevice(device_id), getattr(cu.CUgraphMem_attribute, name))
        values.append(int(value) if err == SUCCESS else 0)
    return GraphMemory(*values)


def trim_graph_memory(cu, device_id: int) -> None:
    """Give back the graph memory no graph uses (``cuDeviceGraphMemTrim``).

    :raises CudaAPIError: when the driver refuses."""
    trim = getattr(cu, "cuDeviceGraphMemTrim", None)
    if trim is not None:
        check(trim(cu.CUdevice(device_id)), f"cuDeviceGraphMemTrim(device {device_id})")
