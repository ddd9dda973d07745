"""Rule 13 of :mod:`numba_pool.allocator`: stream capture (CUDA graphs).

What the driver allows during a capture is listed in :mod:`numba_pool.cuda.capture`.  The
policy:

* **Captured allocations** (:class:`GraphBlocks`): an allocation whose stream is being captured
  (``using_stream(s)`` with ``s`` capturing, or, in the thread that captures, one outside any
  ``using_stream``) becomes an allocation node of the graph: ``cuMemAllocFromPoolAsync`` on the
  capturing stream, from a pool that graphs accept (not exportable).  Never an arena block or a
  scratch carve: those have no node, and the graph's kernels would write them at every replay
  after their next owner got them.
* **Their release** during the capture is a free node (``cuMemFreeAsync`` on the capturing
  stream); after it, the graph owns the memory: the release frees the graph's allocation with
  ``cuMemFreeAsync`` on the capture stream (after the launches ordered there), and where the
  graph has not allocated it (not launched yet, or freed it itself at a relaunch with
  ``CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH``) there is nothing to free.
* **While a capture is under way** (:data:`underway`: the captures numba_pool knows of), nothing
  numba_pool does may touch the legacy stream (unusable while a blocking stream captures) or
  synchronize (which invalidates every capture), and its other driver calls run in relaxed
  capture mode (under a global-mode capture they would invalidate it): allocations on other
  streams come straight from the mempool (no arena, whose fences use the legacy stream); those of
  the legacy stream from a side stream, synchronized; releases are held back (:func:`defer`)
  and run, in order, once no known capture is under way (:func:`refresh`).

numba_pool knows of a capture from the first allocation on the capturing stream, or from
``using_stream`` entered with it; an allocation in another thread before that follows CUDA's own
rules (a global-mode capture refuses it, as it refuses ``cuMemAlloc``).

Threads: :data:`underway` and the deferred releases take atomic container operations only (the
release path); :data:`_lock` guards adding and dropping captures.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from ..cuda import driver as _driver
from ..cuda.capture import capture_id, is_capturing, relaxed
from ..cuda.driver import SUCCESS, check, report_failure, warn
from ..cuda.errors import api_error
from ..cuda.streams import LEGACY, StreamRef, per_thread, scopes_entered
from .block import Block, make_block
from .fences import PrivateStream

_INVALID_VALUE = _driver.cuda_driver.CUresult.CUDA_ERROR_INVALID_VALUE
_NO_CONTEXT = _driver.cuda_driver.CUresult.CUDA_ERROR_INVALID_CONTEXT
_NONE = _driver.cuda_driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


@dataclass(frozen=True)
class Capture:
    """A capture sequence numba_pool knows of: its stream, its id (``cuStreamGetCaptureInfo``)
    and the host thread that allocated on it first (where allocations outside ``using_stream``
    join it)."""

    stream: StreamRef
    id: int
    thread: int


#: The captures under way that numba_pool knows of.  Empty almost always: the allocation paths
#: test its truth (one load) and take :class:`CaptureRouter`'s path while it is not.
underway: list[Capture] = []
#: Releases held back while a capture is under way, run by :func:`refresh` (atomic operations).
_deferred: deque = deque()
_lock = threading.Lock()  # guards changes of `underway` (never taken by a release)


def note(stream: StreamRef, cid: int) -> Capture:
    """Register the capture ``cid`` on ``stream`` (once), from the calling thread."""
    with _lock:
        for capture in underway:
            if capture.id == cid:
                return capture
        capture = Capture(stream, cid, threading.get_ident())
        underway.append(capture)
        return capture


def note_if_capturing(stream: StreamRef) -> None:
    """``using_stream``'s hook: register ``stream``'s capture if it is being captured now
    (``cuStreamIsCapturing``, 0.3 µs per scope entered).  A driver that cannot answer (none
    loaded) registers nothing."""
    if stream is LEGACY:
        return
    cu = _driver.cu
    try:
        cid = capture_id(cu, stream.handle) if is_capturing(cu, stream.handle) else 0
    except Exception:  # noqa: BLE001 - no driver here: nothing can be capturing
        return
    if cid:
        note(stream, cid)


def _goes_on(cu, capture: Capture) -> bool:
    """Whether ``capture`` is still under way, as far as the calling thread can tell: a thread
    with no current context cannot ask (``CUDA_ERROR_INVALID_CONTEXT``), and then it is taken
    to go on; a destroyed stream's capture has ended."""
    result = cu.cuStreamGetCaptureInfo(capture.stream.handle)
    if result[0] == _NO_CONTEXT:
        return True
    return result[0] == SUCCESS and result[1] != _NONE and int(result[2]) == capture.id


def still_capturing(cu) -> bool:
    """Whether a known capture is still under way, asked of the driver (``cuStreamGetCaptureInfo``,
    1 µs per known capture) without the lock: for a release, which may not take it, when
    :data:`underway` is not empty (a capture that has ended stays listed until :func:`refresh`).
    A thread that cannot ask (no current context) takes it to go on."""
    return any(_goes_on(cu, c) for c in list(underway))


def defer(release: Callable[[], None]) -> None:
    """Hold ``release`` (which must not raise) back until no known capture is under way."""
    _deferred.append(release)


def refresh(cu) -> bool:
    """Drop the captures that have ended; once none is left, run the releases held back (in
    the calling thread, oldest first).  Returns whether a capture is still under way."""
    if underway:
        with _lock:
            underway[:] = [c for c in underway if _goes_on(cu, c)]
        if underway:
            return True
    while _deferred and not underway:
        try:
            release = _deferred.popleft()
        except IndexError:
            break
        try:
            release()
        except Exception as err:  # noqa: BLE001 - a release never raises; this one did: say so, go on
            warn(f"a release held back during a stream capture failed: {err}")
    return bool(underway)


def held_back() -> int:
    """How many releases wait for the captures under way to end."""
    return len(_deferred)


def capture_of_thread() -> Capture | None:
    """The known capture the calling thread allocated on first, if any."""
    ident = threading.get_ident()
    for capture in list(underway):
        if capture.thread == ident:
            return capture
    return None


class GraphBlocks:
    """Rule 13's captured allocations: allocation nodes of the graph being captured, from a
    pool that graph nodes accept (``pool()``: the device's mempool when it is not exportable,
    else one made for captures), freed by a free node or, after the capture, outside the graph.

    :param cu: the driver object.
    :param pool: returns the ``CUmemoryPool`` to allocate from (made at the first capture).
    """

    def __init__(self, cu, pool: Callable[[], object]):
        self._cu = cu
        self._pool = pool
        self.live: dict = {}  # CUdeviceptr -> bytes, arrays allocated in captures (atomic ops)
        self.left_to_graphs = 0  # releases after a capture that found no allocation to free

    def allocate(self, size: int, capture: Capture) -> Block:
        """``size`` bytes as an allocation node of ``capture``'s graph.

        :raises CudaAPIError: the driver's error (out of memory included: no synchronize or
            trim may run during a capture)."""
        cu, stream = self._cu, capture.stream
        err, ptr = cu.cuMemAllocFromPoolAsync(size, self._pool(), stream.handle)
        if err:
            raise api_error(err, f"numba_pool: cuMemAllocFromPoolAsync({size} bytes) in the capture of stream "
                                 f"{stream.value:#x} failed with {err.name}")
        self.live[ptr] = size
        block = make_block(ptr, size, stream, self._release)
        block.capture = capture.id
        return block

    def _release(self, block: Block) -> None:
        # Any thread, from a finalizer: never raises.
        ptr, stream, cid = block.ptr, block.stream, block.capture
        if self.live.pop(ptr, None) is None:
            return
        cu = self._cu
        if capture_id(cu, stream.handle) == cid:  # still in its capture: a free node
            report_failure(cu.cuMemFreeAsync(ptr, stream.handle), f"cuMemFreeAsync({int(ptr):#x}) in a capture")
            return
        if underway and still_capturing(cu):
            defer(partial(self._free_outside, ptr, stream))
            return
        self._free_outside(ptr, stream)

    def _free_outside(self, ptr, stream: StreamRef) -> None:
        # After the capture: on the capture stream, after the graph's launches ordered there.
        err, = self._cu.cuMemFreeAsync(ptr, stream.handle)
        if err == _INVALID_VALUE:  # not allocated now: the graph never ran, or freed it at a relaunch
            self.left_to_graphs += 1
        elif err:
            report_failure((err,), f"cuMemFreeAsync({int(ptr):#x}) of graph memory")


class CaptureRouter:
    """Where an allocation goes while a capture is under way, or when its stream is being
    captured: the allocation paths' slow branch (:meth:`allocate`).

    :param cu: the driver object.
    :param graph_blocks: the captured allocations.
    :param normal: the allocation path without capture (the block source's ``allocate``).
    :param on_stream: ``(size, stream)``: a mempool block on a stream that is not captured.
    :param beside: ``(size)``: a mempool block for the legacy stream's users, allocated on a
        side stream and synchronized, released as the legacy stream's.
    """

    def __init__(self, cu, graph_blocks: GraphBlocks, normal: Callable, on_stream: Callable, beside: Callable):
        self._cu = cu
        self.graph_blocks = graph_blocks
        self._normal = normal
        self._on_stream = on_stream
        self._beside = beside

    def allocate(self, size: int, stream: StreamRef) -> Block:
        """``size`` bytes for work on ``stream``: a node of the capture it belongs to, else the
        normal path once no capture is left, else beside the captures (relaxed mode, no legacy
        stream)."""
        capture = self._capture_for(stream)
        if capture is not None:
            return self.graph_blocks.allocate(size, capture)
        if not refresh(self._cu):
            return self._normal(size, stream)
        with relaxed(self._cu):
            if stream is LEGACY:
                return self._beside(size)
            return self._on_stream(size, stream)

    def _capture_for(self, stream: StreamRef) -> Capture | None:
        cu = self._cu
        if stream is not LEGACY:
            cid = capture_id(cu, stream.handle)
            return note(stream, cid) if cid else None
        capture = capture_of_thread()
        return capture if capture is not None and _goes_on(cu, capture) else None


def SideStream(cu, what: str) -> PrivateStream:
    """Rule 13: a non-blocking stream of numba_pool's own, made at its first use, on which
    blocks for the legacy stream's users are allocated (and synchronized) while a capture is
    under way: the legacy stream would join or break the capture."""
    return PrivateStream(cu, f"{what} beside a capture")


def capture_pool_config(config):
    """The options of the pool made for captures: the device pool's, not exportable."""
    return replace(config, ipc=False, use_default_pool=False)
