"""A linear pool: one block, bump-allocated, freed all at once.

For the allocate-everything-then-drop-everything pattern: inside ``with numba_pool.scratch(n):``
every device allocation of the calling thread takes the next 256-byte-aligned piece of one
block reserved on entry (an offset allocator, no per-array free).  A request larger than what
is left takes the normal path.  The block is one mempool allocation: it goes back to the pool,
stream-ordered like any other, once the scope has exited *and* every array carved from it is
gone, so an array that outlives the scope stays valid.  Arrays in one scratch block never
share memory (nothing is reused inside it), which is why the stream rule needs nothing more.
``record_stream`` on a carved array belongs to that array: the block waits for the recorded
streams when the array is dropped, since it is released later, when they may be destroyed.  An
IPC export of a carved array holds the block: its release waits for the last importer.
The allocation log (``NUMBA_POOL_LOG``) records the arrays, at their own addresses, and not the
block they are carved from.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Iterator

from cuda.bindings import driver as cu

from ..cuda.pointers import PoolPointer
from ..cuda.streams import LEGACY, StreamRef, enter_scope, leave_scope, per_thread
from .block import Block, make_block, take_waits
from .free_list import round_up
from .waits import split_waiting


class ScratchBlock:
    """One reserved block and its bump offset (bytes).

    :param block: the reserved block (a pointer from the device allocator's block source).
    :param stream: the allocation stream the scope was opened on.
    :param allocator: the :class:`~numba_pool.allocator.device.DeviceAllocator` the block came
        from: its registry of scratch blocks and its release ordering.
    :param overflow: serves the requests that do not fit (bytes -> pointer), on ``stream``:
        the device's block source, with no adaptor (the path around us logs and counts the call).
    """

    def __init__(self, block: PoolPointer, stream: StreamRef, allocator, overflow):
        self.block = block  # our reference keeps the block allocated
        self._parent = block.block  # its Block: what the carved arrays' holds pass to
        self.base = int(block.device_pointer)
        self.size = block.size
        self.offset = 0  # bytes carved so far
        self.stream = stream  # the allocation stream the scope was opened on (no scratch)
        # Arrays carved out and still alive (address -> their Block, whose ``waits`` their
        # releases wait for): atomic dict operations only (finalizers, any thread).
        self._outstanding: dict[int, Block] = {}
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
        """Carve ``size`` bytes (rounded up to 256) off the block, or take the normal path (also
        once a reset freed the block)."""
        need = round_up(size)
        if self.offset + need > self.size or self._allocator is None:
            with _on_stream(self.stream):
                return self._overflow(size)
        address = self.base + self.offset
        self.offset += need
        block = make_block(cu.CUdeviceptr(address), size, self.stream, self._drop)
        block.start, block.rounded, block.ref = address, need, self
        self._outstanding[address] = block
        if self._dropped():  # rule 12: a reset began, and its snapshot holds the block: not ours
            self._outstanding.pop(address, None)
            with _on_stream(self.stream):
                return self._overflow(size)
        return type(self.block)(self.block.context, block.ptr, size, block)

    def _dropped(self) -> bool:
        # After the carve is registered: a reset marks the mempool blocks dropped before it
        # snapshots the ledger that holds this block, so a carve that sees no mark here
        # completed before the reset (which frees it as a live array), and one that sees it is
        # served by the next generation.  The block's own check is too early: the reset
        # forgets the scratch blocks only after its snapshot.
        allocator = self._allocator
        return allocator is None or allocator.mempool_blocks.dropped

    def _carved(self, address: int) -> Block | None:
        for start, block in self._outstanding.copy().items():  # a finalizer may drop one meanwhile
            if start <= address < start + block.rounded:
                return block
        return None

    def add_wait(self, address: int, what) -> bool:
        """Make the release of the carved array holding ``address`` wait for ``what`` (a stream
        given to ``record_stream``, or a hold: :mod:`numba_pool.allocator.waits`); False when no
        carved array holds it."""
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
        # Release of a carved-out array: any thread, must not raise.  Its recorded streams are
        # waited for now, while they are alive; its holds pass to the block, whose release
        # orders at once and is made free when they let go (Note [A release made free later
        # orders now]).
        address = carved.start
        streams, holds = split_waiting(take_waits(carved))
        allocator = self._allocator
        if allocator is not None:
            if self.stream is not LEGACY and any(ref is LEGACY for ref in streams):
                # The legacy stream is waited for by the block's release, through the next
                # fence (Note [The legacy stream recorded] in .waits): never an operation there now.
                allocator.waits.add_wait(self._parent, LEGACY)
                streams = [ref for ref in streams if ref is not LEGACY]
            if streams:  # ordered now, before the block's release on self.stream
                allocator.waits.order_now(streams, self.stream)
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
    """The calling thread's scratch scope on ``allocator`` (a
    :class:`~numba_pool.allocator.device.DeviceAllocator`): one block of ``nbytes`` bytes
    reserved on the thread's allocation stream with ``allocate`` (the block source, no adaptor:
    the block is neither logged nor counted, the arrays carved from it are), bump-allocated
    until the scope exits, released once the scope has exited and every carved array is gone.
    ``allocate`` also serves the requests that do not fit.

    :raises CudaAPIError: when the block cannot be reserved.
    """
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
