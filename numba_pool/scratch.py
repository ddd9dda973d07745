"""A linear pool: one block, bump-allocated, freed all at once.

For the allocate-everything-then-drop-everything pattern: inside ``with numba_pool.scratch(n):``
every device allocation of the calling thread takes the next 256-byte-aligned piece of one
block reserved on entry (an offset allocator, no per-array free).  A request larger than what
is left takes the normal path.  The block is one mempool allocation: it goes back to the pool,
stream-ordered like any other, once the scope has exited *and* every array carved from it is
gone, so an array that outlives the scope stays valid.  Arrays in one scratch block never
share memory (nothing is reused inside it), which is why the stream rule needs nothing more.
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

    def __init__(self, block: MemoryPointer, stream: StreamRef):
        self.block = block  # our reference keeps the block allocated
        self.base = int(block.device_pointer)
        self.size = block.size
        self.offset = 0
        self.stream = stream  # the allocation stream the scope was opened on (no scratch)
        self._outstanding: set[int] = set()  # addresses of arrays carved out and still alive
        self._scope_open = True
        self._release_token = deque([None])  # popped exactly once, by whoever releases the block

    def allocate(self, manager, size: int) -> MemoryPointer:
        """Carve ``size`` bytes (rounded up to 256) off the block, or take the normal path."""
        need = round_up(size)
        if self.offset + need > self.size:
            with _on_stream(self.stream):
                return manager.allocate_unlogged(size)  # the log, if on, is writing this call's row
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
        block = ScratchBlock(manager.allocate_unlogged(nbytes), plain)  # the block is not logged: its arrays are
    enter_scope(plain.with_scratch(block))
    try:
        yield block
    finally:
        _state.stream = current
        block.close_scope()
