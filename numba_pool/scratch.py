"""A linear pool: one block, bump-allocated, freed all at once.

For the allocate-everything-then-drop-everything pattern: inside ``with numba_pool.scratch(n):``
every device allocation of the calling thread takes the next 256-byte-aligned piece of one
block reserved on entry (an offset allocator, no per-array free).  A request larger than what
is left takes the normal path.  The block is one mempool allocation: it goes back to the pool,
stream-ordered like any other, once the scope has exited *and* every array carved from it is
gone, so an array that outlives the scope stays valid.  Arrays in one scratch block never
share memory (nothing is reused inside it), which is why the stream rule needs nothing more.
``record_stream`` on a carved array belongs to that array: the block waits for the recorded
streams when the array is dropped, since it is released later, when they may be destroyed.
The allocation log (``NUMBA_POOL_LOG``) records the arrays, at their own addresses, and not the
block they are carved from.
"""

from __future__ import annotations

import contextlib
from collections import deque
from functools import partial
from typing import Iterator

from .pointer import MemoryPointer  # numba.cuda's (a stand-in under the CUDA simulator)
from cuda.bindings import driver as cu

from .arena import round_up
from .pointer import PoolPointer
from .streams import StreamRef, _state, enter_scope


class ScratchBlock:
    """One reserved block and its bump offset (bytes)."""

    def __init__(self, block: MemoryPointer, stream: StreamRef, ordering):
        self.block = block  # our reference keeps the block allocated
        self.base = int(block.device_pointer)
        self.size = block.size
        self.offset = 0
        self.stream = stream  # the allocation stream the scope was opened on (no scratch)
        # Arrays carved out and still alive (address -> bytes), and the streams recorded for
        # them (address -> streams): atomic dict operations only (finalizers, any thread).
        self._outstanding: dict[int, int] = {}
        self._recorded: dict[int, list[StreamRef]] = {}
        self._scope_open = True
        self._release_token = deque([None])  # popped exactly once, by whoever releases the block
        self._ordering = ordering
        ordering.scratch_blocks[self.base] = self

    def allocate(self, manager, size: int) -> MemoryPointer:
        """Carve ``size`` bytes (rounded up to 256) off the block, or take the normal path."""
        need = round_up(size)
        if self.offset + need > self.size:
            with _on_stream(self.stream):
                return manager.allocate_unlogged(size)  # the log, if on, is writing this call's row
        address = self.base + self.offset
        self.offset += need
        self._outstanding[address] = need
        return PoolPointer(manager.context, cu.CUdeviceptr(address), size, partial(self._drop, address))

    def record(self, address: int, stream: StreamRef) -> bool:
        """``record_stream`` for the carved array holding ``address``; False when none does."""
        for start, size in self._outstanding.copy().items():  # a finalizer may drop one meanwhile
            if start <= address < start + size:
                self._recorded.setdefault(start, []).append(stream)
                return True
        return False

    def forget(self) -> None:
        """A reset freed the block: the arrays still alive release nothing and order nothing."""
        self._recorded.clear()
        self._ordering = None

    def _drop(self, address: int) -> None:
        # Release of a carved-out array: any thread, must not raise.
        recorded = self._recorded.pop(address, None) if self._recorded else None
        ordering = self._ordering
        if recorded and ordering is not None:  # ordered now, before the block's release on self.stream
            ordering.waits.order_now(recorded, self.stream)
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
        ordering = self._ordering
        if ordering is not None:
            ordering.scratch_blocks.pop(self.base, None)
        self.block = None  # the block's own finalizer frees it, stream-ordered


@contextlib.contextmanager
def _on_stream(stream: StreamRef) -> Iterator[None]:
    previous = enter_scope(stream)
    try:
        yield
    finally:
        _state.stream = previous


@contextlib.contextmanager
def scratch(nbytes: int, *, manager=None) -> Iterator[ScratchBlock]:
    """Bump-allocate this thread's device allocations inside the block from one reserved
    block of ``nbytes`` bytes (a linear allocator with free-all).

    :param nbytes: bytes to reserve (rounded up to 256 per allocation inside).
    :param manager: the :class:`~numba_pool.NumbaPoolManager` to reserve from; by default the
        current CUDA context's.
    :raises ValueError: for ``nbytes`` <= 0.
    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    :raises numba.cuda.cudadrv.driver.CudaAPIError: when the block cannot be reserved.
    """
    from . import _manager

    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
        raise ValueError(f"numba_pool.scratch: nbytes={nbytes!r} must be a positive number of bytes")
    manager = _manager() if manager is None else manager
    current = _state.stream
    plain = current.scratch.stream if current.scratch is not None else current
    with _on_stream(plain):
        block = ScratchBlock(manager.allocate_unlogged(nbytes), plain, manager.scratch_ordering())  # the block is not logged: its arrays are
    enter_scope(plain.with_scratch(block))
    try:
        yield block
    finally:
        _state.stream = current
        block.close_scope()
