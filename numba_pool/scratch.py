"""The seeds' linear pool: one block, bump-allocated, freed all at once.

For the allocate-everything-then-drop-everything pattern: inside ``with numba_pool.scratch(n):``
every device allocation of the calling thread takes the next 256-byte-aligned piece of one
block reserved on entry (an offset allocator, no per-array free).  A request larger than what
is left takes the normal path.  The block is one mempool allocation: it goes back to the pool,
stream-ordered like any other, once the scope has exited *and* every array carved from it is
gone, so an array that outlives the scope stays valid.  Arrays in one scratch block never
share memory (nothing is reused inside it), which is why the stream rule needs nothing more.
"""

from __future__ import annotations

import contextlib
from collections import deque
from functools import partial
from typing import Iterator

from numba.cuda import MemoryPointer
from cuda.bindings import driver as cu

from .arena import round_up
from .pointer import PoolPointer
from .streams import StreamRef, _state, enter_scope


class ScratchBlock:
    """One reserved block and its bump offset (bytes)."""

    def __init__(self, block: MemoryPointer, stream: StreamRef):
        self.block = block  # our reference keeps the block allocated
        self.base = int(block.device_pointer)
        self.size = block.size
        self.offset = 0
        self.stream = stream
        self._outstanding: set[int] = set()  # addresses of arrays carved out and still alive
        self._scope_open = True
        self._release_token = deque([None])  # popped exactly once, by whoever releases the block

    def allocate(self, manager, size: int) -> MemoryPointer:
        """Carve ``size`` bytes (rounded up to 256) off the block, or take the normal path."""
        need = round_up(size)
        if self.offset + need > self.size:
            with _without_scratch():
                return manager.memalloc(size)
        address = self.base + self.offset
        self.offset += need
        self._outstanding.add(address)
        return PoolPointer(manager.context, cu.CUdeviceptr(address), size, partial(self._drop, address))

    def _drop(self, address: int) -> None:
        # Release of a carved-out array: any thread, must not raise.
        self._outstanding.discard(address)
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
        self.block = None  # the block's own finalizer frees it, stream-ordered


@contextlib.contextmanager
def _without_scratch() -> Iterator[None]:
    current = enter_scope(StreamRef(_state.stream.handle, _state.stream.owner, key=_state.stream.key))
    try:
        yield
    finally:
        _state.stream = current


@contextlib.contextmanager
def scratch(nbytes: int) -> Iterator[ScratchBlock]:
    """Bump-allocate this thread's device allocations inside the block from one reserved
    block of ``nbytes`` bytes (the seeds' linear pool with free-all).

    :param nbytes: bytes to reserve (rounded up to 256 per allocation inside).
    :raises ValueError: for ``nbytes`` <= 0.
    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    :raises numba.cuda.cudadrv.driver.CudaAPIError: when the block cannot be reserved.
    """
    from . import _manager

    if not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"numba_pool.scratch: nbytes={nbytes!r} must be a positive number of bytes")
    manager = _manager()
    current = _state.stream
    with _without_scratch():
        block = ScratchBlock(manager.memalloc(nbytes), current)
    enter_scope(StreamRef(current.handle, current.owner, scratch=block, key=current.key))
    try:
        yield block
    finally:
        _state.stream = current
        block.close_scope()
