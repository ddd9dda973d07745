"""Rule 13 of :mod:`numba_pool.allocator`: stream capture (CUDA graphs), known at its stream's first allocation or
``using_stream`` (before: CUDA's rules, :mod:`.cuda.capture`).  Threads: atomic only; :data:`_lock` guards changes.

* **Captured allocations** (:class:`~.graph_blocks.GraphBlocks`): on a capturing stream (``using_stream(s)``, or
  outside any scope in the capturing thread), an allocation node (``cuMemAllocFromPoolAsync``, non-exportable
  pool), released as a free node during the capture, after it by ``cuMemFreeAsync`` on the capture stream.
* **While a capture is under way** (:data:`underway`): no legacy-stream use, no synchronize, other calls in relaxed
  mode; other streams' allocations come from the mempool (no arena), the legacy stream's from a synchronized side
  stream; releases wait (:func:`defer`) and run in order once none is (:func:`refresh`), but those made beside it
  (:func:`released_beside`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Callable

from ..cuda import driver as _driver
from ..cuda.capture import capture_id, is_capturing, relaxed
from ..cuda.driver import SUCCESS, warn
from ..cuda.streams import LEGACY, StreamRef
from .block import Block
from .fences import PrivateStream
from .held import Held

_NO_CONTEXT = _driver.cuda_driver.CUresult.CUDA_ERROR_INVALID_CONTEXT
_NONE = _driver.cuda_driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


@dataclass(frozen=True)
class Capture:
    """A known capture: stream, id (``cuStreamGetCaptureInfo``), and the thread that allocated first."""

    stream: StreamRef
    id: int
    thread: int


underway: list[Capture] = []  #: The known captures under way; almost always empty (hot paths test its truth).
_deferred = Held()  #: Releases held back while a capture is under way, run by :func:`refresh` (atomic operations).
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
    """``using_stream``'s hook: note ``stream``'s capture (``cuStreamIsCapturing``, Note [Capture queries])."""
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
    """Whether ``capture`` goes on (assumed with no current context); a destroyed stream's has ended."""
    result = cu.cuStreamGetCaptureInfo(capture.stream.handle)
    if result[0] == _NO_CONTEXT:
        return True
    return result[0] == SUCCESS and result[1] != _NONE and int(result[2]) == capture.id


def still_capturing(cu) -> bool:
    """Whether a known capture goes on (``cuStreamGetCaptureInfo``: Note [Capture queries]); lock-free."""
    return any(_goes_on(cu, c) for c in list(underway))


def defer(release: Callable[[], None]) -> None:
    """Hold ``release`` (which must not raise) back until no known capture is under way."""
    _deferred.keep(release)


def orders_beside(cu, stream: StreamRef) -> bool:
    """Note [Released beside a capture] in :mod:`.release`: whether a release's work on ``stream`` may be done now,
    during a capture, in relaxed mode: a created stream, blocking or not, not itself capturing (``cuStreamIsCapturing``:
    the driver's answer required), neither the legacy stream nor a per-thread default stream.  Never raises."""
    if stream is LEGACY or stream.thread is not None:
        return False
    try:
        err, status = cu.cuStreamIsCapturing(stream.handle)
    except Exception:  # noqa: BLE001 - a release never raises: held back instead
        return False
    return err == SUCCESS and status == _NONE


def released_beside(cu, block: Block) -> bool:
    """Note [Released beside a capture] in :mod:`.release`: whether ``block``'s release (a mempool or an arena
    block's), during a capture, is made at once: a block of a stream :func:`orders_beside` accepts, waiting only for
    holds (a set-aside block's, Note [An address a reset gave again]) and for streams it accepts too
    (``record_stream``'s, :class:`~.waits.Fenced`: the events on them and on the block's stream recorded at the drop,
    the block made free after the next fence once the host sees them done, Note [A named stream is not waited for]
    in :mod:`.device`); inside ``defer_cleanup`` too (its release orders at the drop, Note [A release made free later
    orders now] in :mod:`.waits`).  Never raises."""
    waits = block.waits
    if waits:
        for wait in waits:
            if isinstance(wait, StreamRef) and not orders_beside(cu, wait):
                return False
    return orders_beside(cu, block.stream)


def refresh(cu) -> bool:
    """Drop ended captures; with none left, run the held-back releases oldest first.  True while one goes on."""
    if underway:
        with _lock:
            underway[:] = [c for c in underway if _goes_on(cu, c)]
        if underway:
            return True
    for release in _deferred.drain(lambda: not underway):
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


class CaptureRouter:
    """During a capture: a graph node, ``normal``, ``on_stream`` (uncaptured stream) or ``beside`` (legacy stream)."""

    def __init__(self, cu, graph_blocks, normal: Callable, on_stream: Callable, beside: Callable):
        self._cu = cu
        self.graph_blocks = graph_blocks
        self._normal = normal
        self._on_stream = on_stream
        self._beside = beside

    def allocate(self, size: int, stream: StreamRef) -> Block:
        """``size`` bytes for ``stream``: a capture's node, else the normal path, else beside."""
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
    """Rule 13: our own stream for the legacy stream's allocations during a capture."""
    return PrivateStream(cu, f"{what} beside a capture")


def capture_pool_config(config):
    """The options of the pool made for captures: the device pool's, not exportable."""
    return replace(config, ipc=False, use_default_pool=False)
