"""The EMM door's allocation paths: each block source's ``allocate(size) -> pointer``, Numba's ``memalloc`` with no
adaptor on (:mod:`numba_pool.plugin.path`).  The core's contract is ``allocate_block(nbytes, stream) -> Block``
(:mod:`.block`); this door adds what only the EMM plugin has: the thread's allocation stream (``using_stream``), the
``numba_pool.scratch`` scope, and the frontend's ``pointer`` class.  Its hot paths repeat the core's few lines inline
(Note [No frame between Numba and the source]); the rest goes through the core and :meth:`~.sources.BlockSource.wrap`.
Each class is a facet of one source (:class:`ArenaDoor`, :class:`PooledDoor`), reading its fields."""

from __future__ import annotations

from ..cuda.capture import is_capturing
from ..cuda.pointers import PoolPointer
from ..cuda.streams import LEGACY, per_thread, scopes_entered
from .block import ALLOCATED
from .captures import underway
from .free_list import round_up
from .usage import DRAIN_AT


class ArenaDoor:
    """The EMM door of :class:`~numba_pool.allocator.arena.ArenaBlocks`."""

    def allocate(self, size: int) -> PoolPointer:
        """The EMM plugin's ``memalloc`` in arena mode: ``size`` bytes on the thread's allocation stream; above
        ``max_block`` or inside ``numba_pool.scratch``, the :attr:`delegate`'s (mempool).  Hot: one ``list.pop``.
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` if no slab after the out-of-memory handler; other errors."""
        stream = per_thread.stream if scopes_entered else LEGACY
        if stream is LEGACY and not underway and size <= self.max_block:  # the hot path
            rounded = round_up(size)
            ready = self.ready.get(rounded)
            block = None
            if ready:
                try:
                    block = ready.pop()  # Note [A ready block is its Block] in .arena
                except IndexError:  # another thread took the last one
                    pass
            if block is None:
                block = self._allocate(rounded, LEGACY, self._take_legacy)
                if block is None:  # a reset overtook this allocation
                    return self.wrap(self.after_reset(size, LEGACY))
            elif self.dropped:  # rule 12: a reset began before the pop; it frees the block's slab
                return self.wrap(self.after_reset(size, LEGACY))
            self._note(size)
            block.size, block.waits, block.state = size, None, ALLOCATED
            return self._pointer(self._context, block.ptr, size, block)
        if stream.scratch is not None:
            if not underway:
                return self.delegate(size)  # the mempool blocks' own door, which serves the scratch block
            stream = stream.scratch.stream  # the scope's stream itself: LEGACY is rule 13's side stream's
        elif not underway and size > self.max_block:
            return self.delegate(size)
        return self.wrap(self.allocate_block(size, stream))


class PooledDoor:
    """The EMM door of :class:`~numba_pool.allocator.mempool_blocks.PooledBlocks`."""

    def allocate(self, size: int) -> PoolPointer:
        """The EMM plugin's ``memalloc`` in mempool mode (and the arena's :attr:`delegate`): ``size`` bytes on the
        thread's allocation stream, or from its ``numba_pool.scratch`` block.
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` after the out-of-memory handler made room; other errors."""
        stream = per_thread.stream if scopes_entered else LEGACY
        if stream is LEGACY:
            fences, pending = self.fences, self.pending
            after = fences.after_fence
            if not (underway or fences.batches or pending.nbytes + after.nbytes >= fences.fence_bytes
                    or len(pending) + len(after) >= fences.fence_blocks):
                idle = self.idle.get(size)
                if idle:  # the hot path: an idle block, no lock, no driver call
                    try:
                        block = idle.pop()
                    except IndexError:  # another thread took the last one
                        pass
                    else:  # PooledBlocks.reuse, inline (Note [No frame between Numba and the source])
                        live = block.ledger = self.live
                        block.state = ALLOCATED
                        ptr = block.ptr
                        live[ptr] = block
                        if self.dropped:  # a reset began meanwhile (rule 12)
                            return self.wrap(self._lost_to_reset(live, ptr, size, LEGACY))
                        self._note(size)
                        if len(self._events) > DRAIN_AT:  # UsageTracker.drain_if_due, inline
                            self._drain_if_due()
                        return self._pointer(self._context, ptr, size, block)
        elif stream.scratch is not None:
            if not (underway or is_capturing(self._cu, stream.handle)):
                return stream.scratch.allocate(size)
            stream = stream.scratch.stream  # the scope's stream itself: LEGACY is rule 13's side stream's (no copy)
        return self.wrap(self.allocate_block(size, stream))
