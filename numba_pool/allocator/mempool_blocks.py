"""Rule 7 of :mod:`numba_pool.allocator`: blocks from the mempool (``cuMemAllocFromPoolAsync``; after rule 2's waits,
``cuMemFreeAsync`` on the allocation stream, or rule 7a's idle list); the pool orders reuse.

Note [Legacy-stream frees wait for a fence]
    Outside ``using_stream`` a block comes from the private allocation stream (:class:`~.fences.PrivateStream`), no
    legacy-stream operation.  Its release appends it to :attr:`PooledBlocks.pending` (:mod:`.release`; no driver
    call, no context); an allocation records one fence per batch (rule 4), the batch freed on the private stream once
    complete.  Other streams' blocks: kept idle for the stream (rule 7a), or freed at once on their handle.

Note [Idle blocks are kept by size]
    A completed batch is idle.  Up to :data:`IDLE_BLOCKS` blocks per size stay in :attr:`PooledBlocks.idle` for
    legacy allocations (one lock-free ``list.pop``); the rest go back.  They are the Blocks themselves, handed out
    again (as the arena's, Note [A ready block is its Block]).  A new block is complete on the private stream
    (``cuStreamQuery``, else ``cuStreamSynchronize``) before it goes out.  Trim, out of memory, reset free them."""

from __future__ import annotations

from functools import partial

from ..cuda.capture import NOT_CAPTURING
from ..cuda.driver import NOT_CAPTURING_ANSWER, OUT_OF_MEMORY, SUCCESS, check, hot, report_failure, warn
from ..cuda.errors import api_error
from ..cuda.streams import LEGACY, StreamRef
from .block import ALLOCATED, Block, make_block
from .captures import SideStream, released_beside, underway
from .doors import PooledDoor
from .fences import take_list
from .release import Pending, gate
from .sources import BlockSource
from .stream_idle import StreamIdle
from .usage import DRAIN_AT

IDLE_BLOCKS = 64  #: Idle blocks kept per size in front of the mempool (Note [Idle blocks are kept by size]).


class PooledBlocks(PooledDoor, BlockSource):
    """Rule 7: blocks straight from the mempool.  ``live``: ``CUdeviceptr`` (by identity: no
    ``int()`` on the hot path) -> Block, its ``ledger``; a reset swaps in a new one."""

    def __init__(self, cu, pool_handle, context, waits, usage, on_out_of_memory, after_reset=None, *,
                 pointer: type, **shared):
        super().__init__(cu, pool_handle, context, waits, usage, on_out_of_memory, after_reset, pointer=pointer,
                         **shared)
        self._free_async = hot(cu, "cuMemFreeAsync")
        self.live: dict = {}  # CUdeviceptr -> Block; atomic operations only
        self.pending = Pending()  # released legacy-stream blocks awaiting a fence (rule 4)
        self._private = None  # the allocation stream's handle, once made
        # bytes -> idle Blocks (their stream LEGACY): popped without a lock, filled under the fences' lock.
        self.idle: dict[int, list[Block]] = {}
        self._query = cu.cuStreamQuery
        self._capture_status = hot(cu, "cuStreamIsCapturing")
        self.stream_idle = StreamIdle(cu)  # other streams' released blocks (rule 7a)
        # The release gate (:mod:`.release`), made once: no bound method per block.
        self._release_bound = gate(self, cu, deferral=waits.deferral, owner=waits.owner,
                                   note=self._note, ordered=self._ordered, pending=self.pending,
                                   free_async=self._free_async, keep=self.stream_idle.keep, ledger=True,
                                   on_dropped=self.free_after_reset, beside=partial(released_beside, cu))
        self._side = SideStream(cu, "device blocks")  # rule 13's, made at the first allocation beside a capture

    def allocate_block(self, size: int, stream: StreamRef, not_capturing: bool = False) -> Block:
        """The core's contract (:mod:`.block`): a Block of ``size`` bytes for work on ``stream``;
        no scratch; rule 13 as :meth:`allocate` (``not_capturing``: the caller's ``cuStreamIsCapturing`` just said
        so, not asked again).  :raises CudaAPIError: as :meth:`allocate`."""
        if underway:
            return self.capture_router(size, stream)  # rule 13
        if stream is not LEGACY:
            if not not_capturing:
                answer = self._capture_status(stream.handle)  # is_capturing, inline (Note [Compiled driver calls])
                if answer is not NOT_CAPTURING_ANSWER and answer[0] == SUCCESS and answer[1] != NOT_CAPTURING:
                    return self.capture_router(size, stream)
            key = stream.idle_key  # rule 7a (Note [Idle blocks of a stream]); the key after the capture check
            if key is None:
                key = stream.idle_key = self.stream_idle.key_of(stream)
            idle = self.stream_idle.lists.get((key, size)) if key is not False else None
            if idle:  # a hit settles no fence (a miss does): a block a fence frees never comes back idle here
                try:
                    block = idle.pop()
                except IndexError:  # another thread took the last one
                    pass
                else:
                    self.stream_idle.nbytes -= size
                    block.stream, block.state = stream, ALLOCATED  # reuse(block), inline
                    live = block.ledger = self.live
                    live[block.ptr] = block
                    if self.dropped:
                        return self._lost_to_reset(live, block.ptr, size, stream)
                    self._note(size)
                    if len(self._events) > DRAIN_AT:
                        self._drain_if_due()
                    return block
        fences, pending = self.fences, self.pending
        after = fences.after_fence
        if (fences.batches or fences.unseen or len(pending) + len(after) >= fences.fence_blocks
                or pending.nbytes + after.nbytes >= fences.fence_bytes):
            self.settle()
        if stream is LEGACY:
            idle = self.idle.get(size)
            if idle:
                try:
                    block = idle.pop()
                except IndexError:  # another thread took the last one
                    pass
                else:  # reuse(block), inline (Note [No frame between Numba and the source]): the other doors' hot path
                    live = block.ledger = self.live
                    block.state = ALLOCATED
                    live[block.ptr] = block
                    if self.dropped:  # a reset began meanwhile (rule 12)
                        return self._lost_to_reset(live, block.ptr, size, LEGACY)
                    self._note(size)
                    if len(self._events) > DRAIN_AT:
                        self._drain_if_due()
                    return block
        return self.allocate_on(size, stream)

    def _handle_of(self, stream: StreamRef):
        # The legacy stream's owners' memory comes from the private allocation stream (Note above).
        if stream is not LEGACY:
            return stream.handle
        handle = self._private
        if handle is None:
            handle = self._private = self.alloc_stream.handle
        return handle

    def allocate_on(self, size: int, stream: StreamRef) -> Block:
        """``size`` bytes on ``stream`` from the mempool (no scratch or capture check).

        :raises CudaAPIError: as :meth:`allocate`."""
        handle = self._handle_of(stream)
        err, ptr = self._alloc_async(size, self._pool, handle)
        if err:
            if self.dropped:  # a reset overtook this allocation
                return self.after_reset(size, stream)
            ptr = self._after_error(size, stream, err)
        if stream is LEGACY and self._query(handle)[0]:  # rule 4: complete before it is used elsewhere
            self.alloc_stream.complete()
        return self.reuse(make_block(ptr, size, stream, self._release_bound))

    def reuse(self, block: Block) -> Block:
        """Hand ``block`` out: a new one, or an idle one (Note [Idle blocks are kept by size])
        whose ``size``, ``stream`` (LEGACY) and ``waits`` (None) its release left."""
        live = block.ledger = self.live
        block.state = ALLOCATED
        live[block.ptr] = block
        if self.dropped:  # a reset began meanwhile: the block belongs to the generation it dropped
            return self._lost_to_reset(live, block.ptr, block.size, block.stream)
        self._note(block.size)
        if len(self._events) > DRAIN_AT:  # UsageTracker.drain_if_due, inline
            self._drain_if_due()
        return block

    def allocate_beside(self, size: int) -> Block:
        """Rule 13: ``size`` bytes for legacy-stream users during a capture, allocated and
        synchronized on a side stream (caller in relaxed mode); released as legacy blocks.

        :raises CudaAPIError: the driver's error."""
        side = self._side.handle
        ptr = check(self._alloc_async(size, self._pool, side), f"cuMemAllocFromPoolAsync({size} bytes) beside a capture")
        check(self._cu.cuStreamSynchronize(side), "cuStreamSynchronize (beside a capture)")
        block = make_block(ptr, size, LEGACY, self._release_bound)
        block.ledger = self.live
        self.live[ptr] = block
        self._note(size)
        return block

    def _after_error(self, size: int, stream: StreamRef, err):
        if err != OUT_OF_MEMORY:
            raise api_error(err, f"numba_pool: cuMemAllocFromPoolAsync({size} bytes) failed with {err.name}")
        return self._on_out_of_memory(size, partial(self._retry, size, stream))

    def _lost_to_reset(self, live: dict, ptr, size: int, stream: StreamRef) -> Block:
        # Never used: freed on its stream unless the reset's snapshot took it.
        if live.pop(ptr, None) is not None:
            report_failure(self._free_async(ptr, self._handle_of(stream)), f"cuMemFreeAsync({int(ptr):#x})")
        return self.after_reset(size, stream)

    def _retry(self, size: int, stream: StreamRef):
        return check(self._alloc_async(size, self._pool, self._handle_of(stream)),
                     f"cuMemAllocFromPoolAsync({size} bytes)")

    def _ordered(self, block: Block) -> None:
        # The release gate's ordered release.  The stream is named now, once: a block held
        # (defer_cleanup, a hold) or pending keeps no stream (nor the object owning it) alive.
        stream, block.stream = block.stream, LEGACY
        self._waits.release(block, stream, partial(self._free, block))

    def settle(self) -> None:
        """Rule 4 at an allocation: fence released blocks when due (:meth:`~.fences.Fences.due`)
        and free completed batches; not during a capture (rule 13) or another thread's settle."""
        fences = self.fences
        if underway or not fences.lock.acquire(blocking=False):
            return
        try:
            pending = self.pending
            if fences.due(len(pending), pending.nbytes, self._deferral):
                batch = pending.take()
                try:
                    fences.record(batch)
                except Exception as err:  # noqa: BLE001 - the allocation goes on with other memory
                    pending.add(batch)
                    warn(f"could not record a fence for {len(batch)} released blocks ({err}); they wait for the next")
            if fences.batches or fences.unseen:  # the releases waiting to be seen done: looked at again too
                for batch in fences.completed():
                    self.keep_idle(batch)
        finally:
            fences.lock.release()

    def take_released(self, releases: list) -> list:
        """Before a synchronize: every released legacy block (for :meth:`free_idle`); releases for a fence to ``releases``."""
        with self.fences.lock:
            taken = self.pending.take()
            for batch in self.fences.take_all(releases):
                taken += batch
            for idle in list(self.idle.values()):
                taken += take_list(idle)
            return taken + self.stream_idle.take_all()

    def released_bytes(self) -> int:
        """Bytes released, not yet back in the mempool (counted as used): the legacy stream's, and rule 7a's idle."""
        batches = [batch for _, batch, _ in list(self.fences.batches)]
        waiting = sum(block.size for batch in [list(self.pending), *batches] for block in batch)
        return (waiting + sum(size * len(idle) for size, idle in list(self.idle.items()))
                + self.stream_idle.held_bytes())

    def keep_idle(self, blocks: list) -> None:
        """Idle Blocks into :attr:`idle` (:data:`IDLE_BLOCKS` per size), the rest to the mempool."""
        rest = []
        for block in blocks:
            size = block.size
            idle = self.idle.get(size)
            if idle is None:
                idle = self.idle.setdefault(size, [])
            if len(idle) < IDLE_BLOCKS:
                idle.append(block)
            else:
                rest.append(block)
        if rest:
            self.free_idle(rest)

    def free_idle(self, blocks: list[Block]) -> None:
        """Free idle Blocks on the private stream, in the owner's context."""
        free_async, handle = self._free_async, self._handle_of(LEGACY)
        for block in blocks:
            ptr = block.ptr
            report_failure(free_async(ptr, handle), f"cuMemFreeAsync({int(ptr):#x})")

    def free_completed(self) -> None:
        """Free completed batches, in the owner's context; records no fence."""
        if (self.fences.batches or self.fences.unseen) and not underway:  # rule 13: no query or free in a capture
            self._waits.owner.enter(self._free_completed)

    def _free_completed(self, retry: bool) -> None:  # OwnerContext.enter's signature
        with self.fences.lock:
            for batch in self.fences.completed():
                self.keep_idle(batch)

    def free_after_reset(self) -> None:
        """Free a dropped generation's released legacy blocks on the legacy stream."""
        self._waits.owner.enter(self._free_on_legacy)

    def _free_on_legacy(self, retry: bool) -> None:  # OwnerContext.enter's signature
        kept = self.stream_idle.take_all()  # a release raced the reset (rule 7a): its stream's work may still run
        if kept:
            report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize (a release racing a reset)")
        for block in self.pending.take() + kept:
            ptr = block.ptr
            report_failure(self._free_async(ptr, LEGACY.handle), f"cuMemFreeAsync({int(ptr):#x})")

    def _free(self, block: Block, on: StreamRef | None) -> None:
        # Made free later: on the legacy stream, waits for a fence; on None, idle.
        ptr = block.ptr
        if on is LEGACY:
            self.pending.add([block])  # its stream is LEGACY already (_ordered)
            if self.dropped:  # after a reset's flush: nothing else would free it
                self.free_after_reset()
            return
        check(self._free_async(ptr, self._handle_of(LEGACY) if on is None else on.handle),
              f"cuMemFreeAsync({int(ptr):#x})")

    def take_all(self) -> list:
        """Forget every live allocation (reset); returns their pointers."""
        self.dropped = True
        live, self.live = self.live, {}
        pointers = []
        while live:  # popitem, not a copy: a finalizer racing with us pops each key at most once
            try:
                ptr, block = live.popitem()
            except KeyError:
                break
            self._note(~block.size)
            pointers.append(ptr)
        return pointers

    def blocks(self) -> list[Block]:
        """The live blocks now (a copy: ``dict.copy`` is atomic, finalizers pop meanwhile)."""
        return list(self.live.copy().values())

    def containing_block(self, address: int) -> Block | None:
        """The live block holding ``address`` (a scan: record_stream is rare), else None."""
        for block in self.blocks():
            start = block.address
            if start <= address < start + block.size:
                return block
        return None
