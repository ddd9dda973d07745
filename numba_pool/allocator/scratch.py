"""A linear pool (one block, bump-allocated, freed at once) for allocate-everything-then-drop-everything: inside
``with numba_pool.scratch(n):`` each device allocation of the thread takes the next 256-byte-aligned piece of the block
reserved on entry, or the normal path if too big.  The block (one mempool allocation) goes back, stream-ordered, once
the scope has exited *and* every carved array is gone.  Carved arrays never share memory: the stream rule needs nothing
more.  A carved array's ``record_stream`` streams get an event at its drop (they may be gone when the block goes): the
block goes back once the host sees them done; an IPC export holds the block until the last importer.
``NUMBA_POOL_LOG`` logs the arrays, not the block."""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Iterator

from cuda.bindings import driver as cu

from ..cuda.pointers import PoolPointer
from ..cuda.streams import LEGACY, StreamRef, enter_scope, leave_scope, per_thread
from .block import Block, make_block, take_waits
from .free_list import round_up
from .waits import SeenHold, split_waiting


class ScratchBlock:
    """One reserved ``block`` and its bump offset (bytes) on ``stream``, the scope's allocation stream; ``allocator``:
    its :class:`~.device.DeviceAllocator` (registry, release ordering); ``overflow``: the device's block source, no
    adaptor (the path around us logs and counts the call), for what does not fit (bytes -> pointer) on ``stream``."""

    def __init__(self, block: PoolPointer, stream: StreamRef, allocator, overflow):
        self.block = block  # our reference keeps the block allocated
        self._parent = block.block  # its Block: what the carved arrays' holds pass to
        self.base = int(block.device_pointer)
        self.size = block.size
        self.offset = 0  # bytes carved so far
        self.stream = stream  # the allocation stream the scope was opened on (no scratch)
        self._outstanding: dict[int, Block] = {}  # live carved arrays by address (their waits); atomic dict ops
        self._scope_open = True
        self._release_token = deque([None])  # popped exactly once, by whoever releases the block
        self._allocator = allocator  # None once a reset freed the block
        self._overflow = overflow
        allocator.scratch_blocks[self.base] = self

    @property
    def live_arrays(self) -> int:
        """Arrays carved from the block and still alive."""
        return len(self._outstanding)

    def allocate(self, size: int) -> PoolPointer:
        """Carve ``size`` bytes (rounded up to 256) off the block; else (or after a reset) the normal path."""
        need = round_up(size)
        if self.offset + need > self.size or self._allocator is None:
            with _on_stream(self.stream):
                return self._overflow(size)
        address = self.base + self.offset
        self.offset += need
        block = make_block(cu.CUdeviceptr(address), size, self.stream, self._drop)
        block.rounded, block.ref = need, self
        self._outstanding[address] = block
        if self._dropped():  # rule 12: a reset began, and its snapshot holds the block: not ours
            self._outstanding.pop(address, None)
            with _on_stream(self.stream):
                return self._overflow(size)
        return type(self.block)(self.block.context, block.ptr, size, block)

    def _dropped(self) -> bool:
        # After registering the carve: a reset marks mempool blocks dropped before snapshotting this block's ledger, so
        # a carve seeing no mark completed before the reset (freeing it as a live array); one seeing it is served by the
        # next generation.  Not the block's check (too early): the reset forgets scratch blocks after its snapshot.
        allocator = self._allocator
        return allocator is None or allocator.mempool_blocks.dropped

    def _carved(self, address: int) -> Block | None:
        for start, block in self._outstanding.copy().items():  # a finalizer may drop one meanwhile
            if start <= address < start + block.rounded:
                return block
        return None

    def add_wait(self, address: int, what) -> bool:
        """Make the release of the carved array holding ``address`` wait for ``what`` (a stream given to
        ``record_stream``, or a hold: :mod:`numba_pool.allocator.waits`); False when no carved array holds it."""
        block = self._carved(address)
        allocator = self._allocator
        if block is None or allocator is None:
            return block is not None
        allocator.waits.add_wait(block, what)
        return True

    def forget(self) -> None:
        """A reset freed the block: the arrays still alive release nothing and order nothing."""
        self._allocator = None

    def _drop(self, carved: Block) -> None:
        # Release of a carved array (any thread, never raising; Note [A release made free later orders now]): each
        # recorded stream's work so far is seen done by the host before the block goes back (an event recorded now,
        # while the stream lives), no stream waiting for it (Note [A named stream is not waited for] in .device); the
        # legacy stream's, the next fence's (Note [The legacy stream recorded] in .waits).  Holds pass to the block.
        address = carved.start
        streams, holds = split_waiting(take_waits(carved))
        allocator = self._allocator
        if allocator is not None:
            for ref in streams:
                if ref.same_stream(self.stream):
                    continue
                if ref is LEGACY:
                    allocator.waits.add_wait(self._parent, LEGACY)
                    continue
                seen = SeenHold(carved.rounded)  # its share: the holds' bytes add up to the block's at most
                allocator.waits.add_wait(self._parent, seen)
                allocator.let_go_after(seen, ref, "a scratch block")
            for hold in holds:
                allocator.waits.add_wait(self._parent, hold)
        self._outstanding.pop(address, None)
        if not self._scope_open and not self._outstanding:
            self._release()

    def close_scope(self) -> None:
        self._scope_open = False
        if not self._outstanding:
            self._release()

    def _release(self) -> None:
        try:
            self._release_token.pop()
        except IndexError:  # another thread released it
            return
        allocator = self._allocator
        if allocator is not None:
            allocator.scratch_blocks.pop(self.base, None)
        self.block = None  # the block's own finalizer frees it, stream-ordered


@contextlib.contextmanager
def _on_stream(stream: StreamRef) -> Iterator[None]:
    previous = enter_scope(stream)
    try:
        yield
    finally:
        leave_scope(previous)


@contextlib.contextmanager
def scratch_scope(allocator, nbytes: int, allocate) -> Iterator[ScratchBlock]:
    """The thread's scratch scope on ``allocator``: ``nbytes`` bytes on its allocation stream from ``allocate``, which
    also serves what does not fit (no adaptor: unlike its arrays, the block is not logged or counted).
    :raises CudaAPIError: when the block cannot be reserved."""
    current = per_thread.stream
    plain = current.scratch.stream if current.scratch is not None else current
    with _on_stream(plain):
        block = ScratchBlock(allocate(nbytes), plain, allocator, allocate)
    enter_scope(plain.with_scratch(block))
    try:
        yield block
    finally:
        leave_scope(current)
        block.close_scope()
