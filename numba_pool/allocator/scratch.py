"""A linear pool (one block, bump-allocated, freed at once) for allocate-everything-then-drop-everything: inside
``with numba_pool.scratch(n):`` each device allocation of the thread takes the next 256-byte-aligned piece of the
block reserved on entry; what does not fit takes the normal path.  The block (one mempool allocation) goes back,
stream-ordered, once the scope has exited *and* every carved array is gone: arrays may outlive the scope.  Carved
arrays never share memory, so the stream rule needs nothing more.  A carved array's ``record_stream`` streams are
waited for at its drop (the block goes later, when they may be gone); an IPC export of one holds the block until
the last importer.  The allocation log (``NUMBA_POOL_LOG``) records the arrays, not the block."""

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
    """One reserved ``block`` (from the device's block source) and its bump offset (bytes) on ``stream``, the
    scope's allocation stream; ``allocator``: the :class:`~.device.DeviceAllocator` it came from (scratch-block
    registry, release ordering); ``overflow`` serves what does not fit (bytes -> pointer) on ``stream``: the
    device's block source, no adaptor (the path around us logs and counts the call)."""

    def __init__(self, block: PoolPointer, stream: StreamRef, allocator, overflow):
        self.block = block  # our reference keeps the block allocated
        self._parent = block.block  # its Block: what the carved arrays' holds pass to
        self.base = int(block.device_pointer)
        self.size = block.size
        self.offset = 0  # bytes carved so far
        self.stream = stream  # the allocation stream the scope was opened on (no scratch)
        # Live carved arrays: address -> Block (its ``waits`` for the release); atomic dict operations only.
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
        """Carve ``size`` bytes (rounded up to 256) off the block; else (or after a reset) the normal path."""
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
        # After the carve is registered: a reset marks the mempool blocks dropped before it snapshots the ledger
        # that holds this block, so a carve that sees no mark here completed before the reset (which frees it as a
        # live array), and one that sees it is served by the next generation.  The block's own check is too early:
        # the reset forgets the scratch blocks only after its snapshot.
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
        # Release of a carved-out array: any thread, must not raise.  Its recorded streams are waited for now,
        # while they are alive; its holds pass to the block, whose release orders at once and is made free when
        # they let go (Note [A release made free later orders now]).
        address = carved.start
        streams, holds = split_waiting(take_waits(carved))
        allocator = self._allocator
        if allocator is not None:
            if self.stream is not LEGACY and any(ref is LEGACY for ref in streams):
                # The block's release waits for the legacy stream through the next fence: never an operation
                # there now (Note [The legacy stream recorded] in .waits).
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
    """The calling thread's scratch scope on ``allocator`` (a :class:`~.device.DeviceAllocator`): a block of
    ``nbytes`` bytes on the thread's allocation stream from ``allocate`` (the block source, no adaptor: unlike its
    carved arrays, the block is neither logged nor counted), which also serves what does not fit.

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
