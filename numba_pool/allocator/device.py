"""One device's allocator: its block sources, what their releases wait for, and the barriers
that synchronize (trim, out of memory, reset).

A :class:`DeviceAllocator` lives for one *generation* of a device's memory: from the manager's
initialization to its reset, which frees everything and drops the allocator whole; a release
that outlives it finds nothing to free.  The plugin (:mod:`numba_pool.plugin`) makes a new one
at the next allocation.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Callable

import humanfriendly

from ..config import PoolConfig, release_limit
from ..cuda.capture import relaxed, trim_graph_memory
from ..cuda.context import OwnerContext
from ..cuda.driver import OUT_OF_MEMORY, check, report_failure
from ..cuda.errors import CudaAPIError, api_error
from ..cuda.mempool import MemPool, device_memory_info
from ..cuda.streams import LEGACY, StreamRef
from . import captures
from .arena import ArenaBlocks
from .block import Block
from .captures import CaptureRouter, GraphBlocks, capture_pool_config
from .fences import FENCE_FRACTION, PrivateStream, run_releases
from .mempool_blocks import PooledBlocks
from .usage import UsageTracker
from .waits import Deferral, Hold, StreamWaits


def _fmt(nbytes: int) -> str:
    return f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)"


class DeviceAllocator:
    """One generation of one device's memory: the mempool blocks (rule 7), the arena when it
    is on (rules 1, 3-6), live scratch blocks, ``record_stream`` and IPC holds (rule 2), and the
    barriers that synchronize.

    :param cu: the driver object (:mod:`numba_pool.cuda.driver`).
    :param pool: the device's mempool.
    :param context: the Numba context the pointers belong to.
    :param pointer: the class of the pointers handed out (the frontend's ``PoolPointer``).
    :param usage: the usage tracker allocations and frees append their events to.
    :param config: the options in effect (``arena``, its sizes, ``release_threshold``).
    :param before_retry: called before an allocation that ran out of memory is retried (Numba's
        pending deallocations).
    :param deferral: ``defer_cleanup``'s state, which outlives a reset (the manager's).
    :param after_reset: ``(size, stream) -> Block``: serves an allocation that a reset of this
        generation overtook, from the next one (the manager's :meth:`allocate`).
    """

    def __init__(self, cu, pool: MemPool, context, usage: UsageTracker, config: PoolConfig, *,
                 before_retry: Callable[[], None] = lambda: None, deferral: Deferral | None = None,
                 after_reset: Callable[[int, StreamRef], Block] | None = None, pointer: type):
        self.cu = cu  # the driver object (IPC exports through it)
        self.pool = pool
        self._usage = usage
        self._before_retry = before_retry
        self.waits = StreamWaits(cu, OwnerContext.of(cu, context), deferral)
        # Live numba_pool.scratch blocks by start address (atomic dict operations only).
        self.scratch_blocks: dict[int, object] = {}
        # Rule 4: the legacy stream's owners' new memory comes from a private stream, and
        # other streams' arena slabs go back on another (destroyed once this generation is garbage).
        self.private_streams = (PrivateStream(cu, "allocations"), PrivateStream(cu, "arena slab returns"))
        shared = {"alloc_stream": self.private_streams[0],
                  "fence_bytes": int(device_memory_info(cu)[1] * FENCE_FRACTION)}
        self.mempool_blocks = PooledBlocks(cu, pool.handle, context, self.waits, usage, self.out_of_memory,
                                           after_reset, pointer=pointer, **shared)
        #: The arenas: one when it is on, else none (a list, not an optional: the barriers and
        #: figures loop over it).
        self.arenas: list[ArenaBlocks] = []
        if config.arena:
            self.arenas.append(ArenaBlocks(
                cu, pool.handle, context, self.waits, usage, self.out_of_memory, slab_size=config.arena_slab_size,
                max_block=config.arena_max_block, release_threshold=release_limit(config.release_threshold),
                delegate=self.mempool_blocks.allocate, delegate_block=self.mempool_blocks.allocate_block,
                after_reset=after_reset, pointer=pointer, return_stream=self.private_streams[1], **shared))
        #: The arena when it is on, else None (for readers: statistics, the replay, tests).
        self.arena: ArenaBlocks | None = self.arenas[0] if self.arenas else None
        #: Every block source, the one requests start at first.
        self.sources = [*self.arenas, self.mempool_blocks]
        #: Where every request starts: the arena when it is on, else the mempool blocks.  Its
        #: ``allocate(size)`` is the allocation path with no adaptor (:mod:`numba_pool.plugin.path`).
        self.source = self.sources[0]
        # Rule 13: captured allocations, and where allocations go while a capture is under way.
        self._config = config
        self._capture_pool: MemPool | None = None
        self.graph_blocks = GraphBlocks(cu, self._pool_for_captures)
        router = CaptureRouter(cu, self.graph_blocks, self.source.allocate_block, self.mempool_blocks.allocate_on,
                               self.mempool_blocks.allocate_beside)
        for source in self.sources:
            source.capture_router = router.allocate

    def _pool_for_captures(self):
        """The pool that captured allocations name: the device's mempool when graphs accept it
        (not exportable), else a pool made for captures at the first one (relaxed mode: the
        capture under way must not see the creation)."""
        if not self.pool.exportable:
            return self.pool.handle
        if self._capture_pool is None:
            with relaxed(self.cu):
                self._capture_pool = MemPool(self.cu, self.pool.device_id, capture_pool_config(self._config), 0)
        return self._capture_pool.handle

    # -- the core's contract (:mod:`.block`) ---------------------------------------------------

    def allocate(self, nbytes: int, stream: StreamRef = LEGACY) -> Block:
        """``nbytes`` bytes for work on ``stream`` (RMM's and cuda.core's stream-ordered
        ``allocate``): a :class:`~numba_pool.allocator.block.Block` from the block source (the
        arena when it is on, else the mempool blocks), to be given back with
        :meth:`deallocate`.  ``stream`` is a :class:`~numba_pool.cuda.streams.StreamRef` the
        caller (a door) owns and keeps alive until then; :data:`LEGACY` for the legacy
        stream.  Knows no frontend, and no ``using_stream`` or ``numba_pool.scratch`` scope.

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` when the request cannot be met even
            after synchronizing and trimming (:meth:`out_of_memory`); any other driver error
            (``cuMemAllocFromPoolAsync``) as returned."""
        return self.source.allocate_block(nbytes, stream)

    def deallocate(self, block: Block, stream: StreamRef | None = None) -> None:
        """Give ``block`` back (RMM's and cuda.core's stream-ordered ``deallocate``), by the
        stream rule: its release is ordered on its allocation stream (``block.stream``); a
        ``stream`` other than that one has used it last, so the release waits for it first
        (:meth:`record_stream`, rule 2).  Once per block; never raises (rule 8)."""
        if stream is not None and stream.value != block.stream.value:
            self.record_stream(block.address, stream)
        block.release(block)

    # -- what a release waits for (rule 2) --------------------------------------------------

    def _block_at(self, address: int) -> int | None:
        for source in (self.mempool_blocks, *self.arenas):
            start = source.containing_block(address)
            if start is not None:
                return start
        return None

    def record_stream(self, address: int, stream: StreamRef) -> bool:
        """Rule 2 for the block holding ``address``; False when no live block holds it.  In a
        scratch block the record belongs to the array carved from it, which applies it when it
        is dropped (:meth:`StreamWaits.order_now`): the block is released later, when the
        stream may be gone."""
        return self._add_wait(address, stream)

    def hold(self, address: int, hold: Hold) -> bool:
        """Keep the block holding ``address`` (the carved array, in a scratch block) from reuse
        after its release until ``hold`` lets go (an IPC export's leases); False when no live
        block holds it."""
        return self._add_wait(address, hold)

    def export_hold(self, address: int, hold: Hold) -> bool:
        """An IPC export of the block holding ``address``: :meth:`hold`, then synchronize the
        context (``cuCtxSynchronize``), so that the block's allocation and every use of its
        previous owners have completed before another process, which orders its work against
        nothing of this one, may touch it (the driver requires the allocation complete, "Stream
        Ordered Memory Allocator", IPC).  Exports are rare: the synchronize is their cost.
        False when no live block holds ``address``.

        :raises CudaAPIError: when the synchronize fails.
        :raises RuntimeError: during a stream capture numba_pool knows of (rule 13)."""
        self.refuse_during_capture("an IPC export (it synchronizes the context)")
        if not self.hold(address, hold):
            return False
        check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize (IPC export)")
        return True

    def _add_wait(self, address: int, what) -> bool:
        start = self._block_at(address)
        if start is None:
            return False
        scratch = self.scratch_blocks.get(start)
        if scratch is not None:
            return scratch.add_wait(address, what)
        self.waits.add_wait(start, what)
        return True

    def allocation_of(self, address: int) -> tuple[int, int] | None:
        """``(base, size)`` in bytes of the mempool allocation that holds the live block at
        ``address``: the block itself on the mempool path, its slab in the arena (what
        ``cuMemPoolExportPointer`` accepts); None when no live block holds it."""
        start = self.mempool_blocks.containing_block(address)
        if start is not None:
            return start, self.mempool_blocks.block_size(start)
        for arena in self.arenas:
            if arena.containing_block(address) is not None:
                return arena.slab_of(address)
        return None

    # -- figures ----------------------------------------------------------------------------

    def segments(self) -> list[dict]:
        """What this generation holds, for a snapshot (:func:`segments`)."""
        return segments(self)

    def issue_frees(self) -> None:
        """Before figures are read and before a barrier: releases held back by a capture that
        has ended run (rule 13), and released mempool blocks whose fence the host has seen
        complete go back to the pool (rule 4, Note [Legacy-stream frees wait for a fence] in
        :mod:`.mempool_blocks`), in the owner's context."""
        if captures.underway or captures.held_back():
            captures.refresh(self.cu)
        self.mempool_blocks.free_completed()

    def refuse_during_capture(self, what: str) -> None:
        """Rule 13: a synchronize invalidates every capture under way.

        :raises RuntimeError: naming ``what`` and the capturing stream, while numba_pool knows
            of a capture under way."""
        if captures.underway and captures.refresh(self.cu):
            streams = ", ".join(f"{c.stream.value:#x}" for c in list(captures.underway))
            raise RuntimeError(f"numba_pool: {what} cannot run while stream {streams} is being captured: "
                               "it would invalidate the capture; call it after cuStreamEndCapture")

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes that allocations can still get: the device's free memory
        (``cuMemGetInfo``) plus what the pool and the arena hold unused; with a cap, at most
        the cap minus what the pool has handed out, and *total* is the cap."""
        self.issue_frees()
        free, total = device_memory_info(self.cu)
        usage = self.pool.usage()
        free += usage.reserved - usage.used + self.mempool_blocks.released_bytes()  # rule 4's: free soon
        for arena in self.arenas:
            figures = arena.statistics()
            free += figures.reserved - figures.in_use
        cap = self.pool.max_size
        if cap:
            total = cap
            free = min(free, cap - usage.used)
        return free, total

    def describe_out_of_memory(self, size: int) -> str:
        """The one line of an allocation of ``size`` bytes that failed after the retry: the
        pool's reserved and used bytes, its cap, the arena's slabs, the device's free memory."""
        pool = self.pool
        usage = pool.usage()
        free, total = device_memory_info(self.cu)
        kind = "private mempool" if pool.is_private else "device default mempool"
        cap = f" (capped at {_fmt(pool.max_size)})" if pool.max_size else ""
        arena = ""
        for a in (arena.statistics() for arena in self.arenas):
            arena = f", arena slabs {_fmt(a.reserved)} of which {_fmt(a.in_use)} in blocks"
        return (f"numba_pool: out of memory allocating {_fmt(size)} on device {pool.device_id} "
                f"after synchronizing, trimming and retrying once: {kind}{cap} reserves {_fmt(usage.reserved)}, "
                f"of which {_fmt(usage.used)} used{arena}; device has {_fmt(free)} free of {_fmt(total)}")

    # -- barriers -----------------------------------------------------------------------------

    def out_of_memory(self, size: int, retry: Callable):
        """An allocation of ``size`` bytes ran out of memory: make room, ``retry()`` once.

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with :meth:`describe_out_of_memory`'s
            line when the retry fails too.
        """
        self._usage.count_oom(failed=False)
        if captures.underway:  # rule 13: no synchronize or trim during a capture
            self._usage.count_oom(failed=True)
            raise api_error(OUT_OF_MEMORY, self.describe_out_of_memory(size).replace(
                "after synchronizing, trimming and retrying once", "during a stream capture (nothing synchronized or trimmed)"))
        self._before_retry()
        self.trim(0)
        try:
            return retry()
        except CudaAPIError as err:
            self._usage.count_oom(failed=True)
            if err.code != OUT_OF_MEMORY:
                raise
            raise api_error(err.code, self.describe_out_of_memory(size)) from None

    def trim(self, keep_bytes: int) -> None:
        """Take every released block waiting for a fence or its completion (rule 4's snapshot
        before the barrier), synchronize (``cuCtxSynchronize``: they are idle now), give them
        and the arena's empty slabs back to the mempool, synchronize again so that those
        stream-ordered frees have completed, and release the pool's unused memory down to
        ``keep_bytes`` (``cuMemPoolTrimTo``), and the graph memory that no graph uses
        (``cuDeviceGraphMemTrim``).

        :raises RuntimeError: during a stream capture (rule 13)."""
        self.refuse_during_capture("trim()")
        self.issue_frees()
        releases: list = []  # Note [The legacy stream recorded] in .waits: made free after the synchronize
        released = self.mempool_blocks.take_released(releases)
        arena_released = [arena.take_released(releases) for arena in self.arenas]
        check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
        self.mempool_blocks.free_idle(released)
        run_releases(releases)
        for arena, taken in zip(self.arenas, arena_released):
            arena.release_cached(taken)
        check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
        self.pool.trim(keep_bytes)
        if self._capture_pool is not None:
            self._capture_pool.trim(keep_bytes)
        trim_graph_memory(self.cu, self.pool.device_id)  # what no graph uses

    def reset(self) -> None:
        """Free everything and give the pool's memory back.  The snapshot (every live pointer,
        every slab) is taken before the synchronize; finalizers that run later find nothing to
        free, and allocations under way go to the next generation (the sources' ``dropped``).
        The pool is trimmed to 0 now and destroyed once this generation is collected: an
        allocation under way may still name it."""
        releases: list = []  # Note [The legacy stream recorded] in .waits: made free after the synchronize
        pointers = self.mempool_blocks.take_all() + [ptr for ptr, _ in self.mempool_blocks.take_released(releases)]
        for arena in self.arenas:
            arena.fences.take_all(releases)
            pointers += [self.cu.CUdeviceptr(start) for start, _ in arena.drop_all()]
        self.waits.waiting.clear()
        self.graph_blocks.live.clear()  # graph memory: its graphs' own, not this pool's
        while self.scratch_blocks:  # popitem, not a copy: a finalizer may pop one meanwhile
            try:
                self.scratch_blocks.popitem()[1].forget()
            except KeyError:
                break
        report_failure(self.cu.cuCtxSynchronize(), "cuCtxSynchronize (reset)")
        self.waits.deferral.flush()  # held-back mempool frees: issued now, before the pool goes
        self.waits.release_held()  # and those an IPC export's leases keep
        run_releases(releases)  # into the dropped generation: freed on the private stream, or nothing
        # What those released (later ones free themselves).
        late: list = []
        pointers += [ptr for ptr, _ in self.mempool_blocks.take_released(late)]
        for ptr in pointers:
            report_failure(self.cu.cuMemFreeAsync(ptr, LEGACY.handle), "cuMemFreeAsync (reset)")
        report_failure(self.cu.cuCtxSynchronize(), "cuCtxSynchronize (reset)")
        run_releases(late)
        with contextlib.suppress(CudaAPIError):
            self.pool.trim(0)
        destroy_when_collected(self, self.pool, self.waits.owner)
        fences = [source.fences for source in self.sources]
        weakref.finalize(self, _destroy_private, self.private_streams, fences, self.waits.owner).atexit = False
        if self._capture_pool is not None:
            destroy_when_collected(self, self._capture_pool, self.waits.owner)


def segments(allocator: DeviceAllocator) -> list[dict]:
    """What ``allocator``'s generation holds, for a snapshot: one segment per arena slab (its blocks
    allocated, awaiting their free, or free), per scratch block (its carved arrays are not
    tracked here: the snapshot fills them from the history) and per live mempool
    allocation, then the mempool's reserve that nothing holds (reserved minus everything
    above, with the driver's rounding).  Each segment: ``kind`` (``"arena slab"``,
    ``"scratch"``, ``"mempool"``, ``"mempool reserve"``), ``address``, ``size``,
    ``stream`` (0 for the legacy stream), ``blocks`` as ``(address, size, state)``.
    Bytes throughout."""
    allocator.issue_frees()
    out = []
    slab_starts = set()
    for arena in allocator.arenas:
        for start, size, key, blocks in arena.layout():
            slab_starts.add(start)
            out.append({"kind": "arena slab", "address": start, "size": size,
                        "stream": key if isinstance(key, int) else 0, "blocks": blocks})
    for ptr, size in allocator.mempool_blocks.ledger.copy().items():
        start = int(ptr)
        if start in slab_starts:
            continue  # the arena's slab (its ledger entry is the slab's allocation)
        kind = "scratch" if start in allocator.scratch_blocks else "mempool"
        out.append({"kind": kind, "address": start, "size": size, "stream": 0,
                    "blocks": [(start, size, "allocated")]})
    held = sum(segment["size"] for segment in out)
    reserve = allocator.pool.usage().reserved - held
    if reserve > 0:
        out.append({"kind": "mempool reserve", "address": 0, "size": reserve, "stream": 0,
                    "blocks": [(0, reserve, "free")]})
    return out


def destroy_when_collected(holder, pool: MemPool, owner: OwnerContext) -> None:
    """Destroy ``pool`` (:meth:`MemPool.destroy`) once ``holder`` is garbage: nothing can
    allocate from it or release into it any more.  In the owner's context, whatever thread the
    collector runs in; not at exit (the context goes with the process)."""
    weakref.finalize(holder, _destroy_pool, pool, owner).atexit = False


def destroy_now(pool: MemPool, owner: OwnerContext) -> None:
    """Destroy ``pool`` now, in the owner's context; a failure is not raised."""
    _destroy_pool(pool, owner)


def _destroy_private(streams, fences, owner: OwnerContext) -> None:
    # A reset generation's private streams and fence events, once nothing can reach them.
    def destroy(*_):
        for stream in streams:
            stream.destroy()
        for each in fences:
            each.destroy()
    owner.enter(destroy)


def _destroy_pool(pool: MemPool, owner: OwnerContext) -> None:
    # A reset generation's pool, once nothing can allocate from it (its allocator is collected):
    # in the owner's context, whatever thread the collector runs in.
    def destroy(*_):
        with contextlib.suppress(CudaAPIError):
            pool.destroy()
    owner.enter(destroy)
