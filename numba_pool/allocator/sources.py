"""What the block sources (:mod:`.mempool_blocks`, :mod:`.arena`) share, bound once: hot paths read attributes."""

from __future__ import annotations

from typing import Callable

from .block import Block
from .fences import Fences, PrivateStream
from .usage import UsageTracker
from .waits import StreamWaits


class BlockSource:
    """The base of the block sources: where memory comes from and what releases share.  ``cu``: the driver
    (:mod:`numba_pool.cuda.driver`); ``pool_handle``: the device's mempool (``CUmemoryPool``); ``context``: the
    pointers' Numba context; ``pointer``: the EMM door's pointer class, ``(context, CUdeviceptr, size, block)``
    (:meth:`numba_pool.cuda.frontend.Frontend.derive`); ``waits``: the allocator's release ordering (rules 2, 8);
    ``usage``: the tracker allocations and frees append events to; ``on_out_of_memory``: ``(size, retry)``, make room,
    then ``retry()`` once (:meth:`~.device.DeviceAllocator.out_of_memory`); ``after_reset``: ``(size, stream) ->
    Block``, the next generation serving an allocation a reset overtook (:attr:`dropped`: none completes in a reset
    generation); ``alloc_stream``: the private stream (:class:`~.fences.PrivateStream`) new legacy-stream memory comes
    from, shared by the device's (None: its own); ``fence_bytes``: released bytes that make a fence due (rule 4,
    :mod:`.fences`; 0: only their count).  ``dropped`` (a reset's): nothing handed out, late releases ignored."""

    def __init__(self, cu, pool_handle, context, waits: StreamWaits, usage: UsageTracker,
                 on_out_of_memory: Callable, after_reset: Callable | None = None, *, pointer: type,
                 alloc_stream: PrivateStream | None = None, fence_bytes: int = 0):
        self._cu = cu
        self._pointer = pointer
        self._alloc_async = cu.cuMemAllocFromPoolAsync  # the hot path's driver call, bound once
        self._pool = pool_handle
        self._context = context
        self._waits = waits
        self._deferral = waits.deferral  # defer_cleanup's depth, read by the fast release paths
        self.dropped = False  # set once, by a reset
        self.after_reset = after_reset if after_reset is not None else _no_successor
        self._note = usage.events.append  # one usage event per allocation (bytes) and free (~bytes)
        self._events = usage.events  # read by the hot paths' inline drain_if_due test
        self._drain_if_due = usage.drain_if_due
        self._on_out_of_memory = on_out_of_memory
        self.alloc_stream = alloc_stream if alloc_stream is not None else PrivateStream(cu, "allocations")
        # Rule 4: the batches of released legacy-stream blocks and their fences.
        self.fences = Fences(cu, fence_bytes or 1 << 62, waits.fence_waits, waits.fence_lock, waits.after_fence,
                             waits.unseen)
        #: Rule 13's slow branch (:class:`~.captures.CaptureRouter`), set by the device allocator: an allocation
        #: while a capture is under way, or on a capturing stream, ``(size, stream) -> Block``.
        self.capture_router: Callable[[int, object], Block] = _no_router

    def wrap(self, block: Block):
        """The EMM door's pointer for ``block`` (hot paths inline it); ``captured``: its graph's capture (rule 13)."""
        mem = self._pointer(self._context, block.ptr, block.size, block)
        capture = getattr(block, "capture", 0)
        if capture:
            mem.captured = capture
        return mem


def _no_successor(size: int, stream=None):
    raise RuntimeError(f"numba_pool: an allocation of {size} bytes was overtaken by a reset of its pool, "
                       "and no allocator serves the next generation")


def _no_router(size: int, stream=None):
    raise RuntimeError(f"numba_pool: an allocation of {size} bytes met a stream capture, and no capture router "
                       "was set up for this block source")
