"""Rule 7 of :mod:`numba_pool.allocator`: blocks straight from the mempool.

Each block is one ``cuMemAllocFromPoolAsync`` on the allocation stream and goes back with one
``cuMemFreeAsync`` on it, after rule 2's waits; the driver's pool orders its reuse from there
("Stream Ordered Memory Allocator", reuse policies).  The arena's large requests and scratch
requests come here too.

Note [Legacy-stream frees are issued by the next allocation]
    The handle of the legacy stream names the legacy stream of whatever context is current in
    the releasing thread, which may be another context (rule 10).  Asking which one is current
    costs 0.43-0.50 µs per release on a lent H100's host (``cuCtxGetCurrent`` through
    cuda-python or ctypes, 2026-11-25), more than half of this path.  So a release of a block
    allocated on the legacy stream makes no driver call: it appends the pointer to
    :attr:`PooledBlocks.legacy_frees` (one atomic ``list.append``), and the next allocation,
    which Numba makes with the owner's context current, issues the ``cuMemFreeAsync`` calls on
    the legacy stream (as do trim, statistics and reset, in the owner's context).  A free
    issued later on the legacy stream is ordered after everything it was ordered after at the
    drop, and more: the rule holds; only the memory's return to the pool waits for the next
    allocation.  Blocks of other streams are freed at once on their own stream's handle, which
    names that stream in any context.
"""

from __future__ import annotations

from functools import partial

from ..cuda.capture import is_capturing
from ..cuda.driver import OUT_OF_MEMORY, check, report_failure
from ..cuda.errors import api_error
from ..cuda.pointers import PoolPointer
from ..cuda.streams import LEGACY, StreamRef, per_thread, scopes_entered
from .captures import SideStream, defer, still_capturing, underway
from .sources import BlockSource


class PooledBlocks(BlockSource):
    """Rule 7: blocks straight from the mempool (``cuMemAllocFromPoolAsync`` and
    ``cuMemFreeAsync`` on the allocation stream).

    ``ledger`` maps each live allocation's ``CUdeviceptr`` (by identity: no ``int()`` on the hot
    path) to its size; :meth:`take_all` swaps in a new one, so a finalizer that outlives a reset
    finds nothing to free.
    """

    def __init__(self, cu, pool_handle, context, waits, usage, on_out_of_memory, after_reset=None, *, pointer: type):
        super().__init__(cu, pool_handle, context, waits, usage, on_out_of_memory, after_reset, pointer=pointer)
        self._free_async = cu.cuMemFreeAsync
        self.ledger: dict = {}  # CUdeviceptr -> bytes requested; atomic operations only
        # Pointers released on the legacy stream, freed by the next allocation (Note above);
        # atomic operations only.
        self.legacy_frees: list = []
        # Bound once: a bound method made per allocation cost 0.1 µs (bench).
        self._release_bound = self._release
        self._side = SideStream(cu, "device blocks")  # rule 13's, made at the first allocation beside a capture

    def allocate(self, size: int) -> PoolPointer:
        """The EMM plugin's ``memalloc`` in mempool mode (and the arena's :attr:`delegate`):
        ``size`` bytes on the thread's allocation stream, freed on it when the pointer is
        released.  Inside ``numba_pool.scratch`` the thread's scratch block serves it.  The
        allocation path (:mod:`numba_pool.plugin.path`) is this method itself when no adaptor is
        on: a dispatching call in between cost 0.25 µs per allocation (``numba-pool bench
        --part allocator``).

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` when the request cannot be met even
            after the out-of-memory handler made room; any other driver error as returned."""
        stream = per_thread.stream if scopes_entered else LEGACY
        if underway or (stream is not LEGACY and is_capturing(self._cu, stream.handle)):
            return self.capture_router(size)  # rule 13
        if stream.scratch is not None:
            return stream.scratch.allocate(size)
        if self.legacy_frees:
            self.issue_legacy_frees()
        return self.allocate_on(size, stream)

    def allocate_on(self, size: int, stream: StreamRef) -> PoolPointer:
        """``size`` bytes on ``stream`` straight from the mempool, freed on it when released
        (no scratch, no capture check: :meth:`allocate` and rule 13's router decide that).

        :raises CudaAPIError: as :meth:`allocate`."""
        err, ptr = self._alloc_async(size, self._pool, stream.handle)
        if err:
            if self.dropped:  # a reset overtook this allocation
                return self.after_reset(size)
            ptr = self._after_error(size, stream, err)
        ledger = self.ledger
        ledger[ptr] = size
        if self.dropped:  # a reset began meanwhile: the block belongs to the generation it dropped
            return self._lost_to_reset(ledger, ptr, size, stream)
        self._note(size)
        self._drain_if_due()
        return self._pointer(self._context, ptr, size, partial(self._release_bound, ledger, ptr, stream))

    def allocate_beside(self, size: int) -> PoolPointer:
        """Rule 13: ``size`` bytes for the legacy stream's users while a capture is under way
        (which the legacy stream would join or break): allocated on a side stream and
        synchronized with it (the caller is in relaxed capture mode), so the block is idle when
        handed out; released as the legacy stream's blocks are, once no capture is under way.

        :raises CudaAPIError: the driver's error."""
        side = self._side.handle
        ptr = check(self._alloc_async(size, self._pool, side), f"cuMemAllocFromPoolAsync({size} bytes) beside a capture")
        check(self._cu.cuStreamSynchronize(side), "cuStreamSynchronize (beside a capture)")
        ledger = self.ledger
        ledger[ptr] = size
        self._note(size)
        return self._pointer(self._context, ptr, size, partial(self._release_bound, ledger, ptr, LEGACY))

    def _after_error(self, size: int, stream: StreamRef, err):
        if err != OUT_OF_MEMORY:
            raise api_error(err, f"numba_pool: cuMemAllocFromPoolAsync({size} bytes) failed with {err.name}")
        return self._on_out_of_memory(size, partial(self._retry, size, stream))

    def _lost_to_reset(self, ledger: dict, ptr, size: int, stream: StreamRef) -> PoolPointer:
        # The block was never used: back on its stream, unless the reset's snapshot took it
        # (then the reset frees it); the next generation serves the request.
        if ledger.pop(ptr, None) is not None:
            report_failure(self._free_async(ptr, stream.handle), f"cuMemFreeAsync({int(ptr):#x})")
        return self.after_reset(size)

    def _retry(self, size: int, stream: StreamRef):
        return check(self._alloc_async(size, self._pool, stream.handle), f"cuMemAllocFromPoolAsync({size} bytes)")

    def _release(self, ledger: dict, ptr, stream: StreamRef) -> None:
        # Any thread, from a finalizer: never raises.
        if underway and still_capturing(self._cu):  # rule 13: no driver call while a capture is under way
            defer(partial(self._release, ledger, ptr, stream))
            return
        size = ledger.pop(ptr, None)
        if size is None:  # a reset freed it already
            return
        self._note(~size)
        waits = self._waits
        if (waits.waiting and int(ptr) in waits.waiting) or self._deferral.depth or stream.thread is not None:
            waits.release(int(ptr), stream, partial(self._free, ptr))
            return
        if stream is LEGACY:  # Note [Legacy-stream frees are issued by the next allocation]
            self.legacy_frees.append(ptr)
            if self.dropped:  # a reset went by: it may have issued the others already
                self.issue_legacy_frees_in_owner_context()
            return
        err, = self._free_async(ptr, stream.handle)  # the stream's handle names it in any context
        if err:
            owner = waits.owner
            if owner.needed():  # rule 10: no context is current in this thread
                owner.run(waits.release, int(ptr), stream, partial(self._free, ptr))
                return
            report_failure((err,), f"cuMemFreeAsync({int(ptr):#x})")

    def issue_legacy_frees(self) -> None:
        """Issue the legacy-stream frees that releases queued, in the calling thread, which
        must have the owner's context current (an allocation, or through
        :meth:`OwnerContext.enter <numba_pool.cuda.context.OwnerContext.enter>`)."""
        if underway:  # rule 13: the legacy stream waits for the captures to end
            return
        frees, free_async, legacy = self.legacy_frees, self._free_async, LEGACY.handle
        while frees:
            try:
                ptr = frees.pop()
            except IndexError:  # another thread took the last one
                return
            err, = free_async(ptr, legacy)
            if err:
                report_failure((err,), f"cuMemFreeAsync({int(ptr):#x})")

    def issue_legacy_frees_in_owner_context(self) -> None:
        """:meth:`issue_legacy_frees` from any thread: the owner's context pushed where another,
        or none, is current (trim, statistics, a release that a reset overtook)."""
        self._waits.owner.enter(self._issue_with_retry_flag)

    def _issue_with_retry_flag(self, retry: bool) -> None:  # OwnerContext.enter's signature
        self.issue_legacy_frees()

    def _free(self, ptr, on: StreamRef | None) -> None:
        # After a synchronize (on is None) nothing earlier remains: the legacy stream will do.
        handle = LEGACY.handle if on is None else on.handle
        check(self._free_async(ptr, handle), f"cuMemFreeAsync({int(ptr):#x})")

    def take_all(self) -> list:
        """Forget every live allocation (for a reset): returns their pointers; finalizers that
        run later find nothing, and allocations under way go to the next generation."""
        self.dropped = True
        ledger, self.ledger = self.ledger, {}
        pointers = []
        while ledger:  # popitem, not a copy: a finalizer racing with us pops each key at most once
            try:
                ptr, size = ledger.popitem()
            except KeyError:
                break
            self._note(~size)
            pointers.append(ptr)
        return pointers

    def block_size(self, start: int) -> int | None:
        """The size in bytes of the live allocation starting at ``start``, else None."""
        for ptr, size in self.ledger.copy().items():  # copy: see containing_block
            if int(ptr) == start:
                return size
        return None

    def containing_block(self, address: int) -> int | None:
        """The start of the live allocation holding ``address`` (a scan: record_stream is rare)."""
        # dict.copy, not list(items()): building the tuples can run the collector, whose
        # finalizers pop from the ledger mid-iteration.
        for ptr, size in self.ledger.copy().items():
            start = int(ptr)
            if start <= address < start + size:
                return start
        return None
