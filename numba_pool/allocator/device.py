"""One device's allocator (:class:`DeviceAllocator`) for one *generation*: from initialization to reset, which drops it
whole (a later release finds nothing to free); the plugin makes a new one at the next allocation."""

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
from .captures import CaptureRouter, capture_pool_config
from .graph_blocks import GraphBlocks
from .fences import FENCE_FRACTION, AfterFence, PrivateStream, run_releases
from .mempool_blocks import PooledBlocks
from .usage import UsageTracker
from .waits import Deferral, Hold, SeenHold, StreamWaits, fenced


def _fmt(nbytes: int) -> str:
    return f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)"


class DeviceAllocator:
    """One generation of one device's memory: the mempool blocks (rule 7), the arena if on (rules 1, 3-6), live
    scratch blocks, ``record_stream`` and IPC holds (rule 2), synchronizing barriers.  ``before_retry`` runs before
    out-of-memory retries (Numba's pending deallocations); ``after_reset`` serves allocations a reset overtook;
    ``on_wait(start)`` runs before a wait is added to the block at ``start``: a door keeping blocks its library freed
    takes it out, and answers True where it had kept it (released then: no live block holds it)."""

    def __init__(self, cu, pool: MemPool, context, usage: UsageTracker, config: PoolConfig, *,
                 before_retry: Callable[[], None] = lambda: None, deferral: Deferral | None = None,
                 after_fence: AfterFence | None = None, unseen: list | None = None,
                 after_reset: Callable[[int, StreamRef], Block] | None = None, pointer: type,
                 on_wait: Callable[[int], bool] = lambda start: False):
        self.cu = cu  # the driver object (IPC exports through it)
        self.pool = pool
        self._usage = usage
        self._before_retry = before_retry
        self._on_wait = on_wait
        self.waits = StreamWaits(cu, OwnerContext.of(cu, context), deferral, after_fence, unseen)
        self.scratch_blocks: dict[int, object] = {}  # live scratch blocks by start address (atomic dict ops only)
        # Rule 4: new memory from a private stream; other streams' slabs go back on another.
        self.private_streams = (PrivateStream(cu, "allocations"), PrivateStream(cu, "arena slab returns"))
        shared = {"alloc_stream": self.private_streams[0],
                  "fence_bytes": int(device_memory_info(cu)[1] * FENCE_FRACTION)}
        self.mempool_blocks = PooledBlocks(cu, pool.handle, context, self.waits, usage, self.out_of_memory,
                                           after_reset, pointer=pointer, **shared)
        self.arenas: list[ArenaBlocks] = []  #: One arena when on, else none (a list: barriers loop over it).
        if config.arena:
            self.arenas.append(ArenaBlocks(
                cu, pool.handle, context, self.waits, usage, self.out_of_memory, slab_size=config.arena_slab_size,
                max_block=config.arena_max_block, release_threshold=release_limit(config.release_threshold),
                delegate=self.mempool_blocks.allocate, delegate_block=self.mempool_blocks.allocate_block,
                after_reset=after_reset, pointer=pointer, return_stream=self.private_streams[1], **shared))
        self.arena: ArenaBlocks | None = self.arenas[0] if self.arenas else None  #: For statistics, the replay, tests.
        self.sources = [*self.arenas, self.mempool_blocks]  #: Every block source, the one requests start at first.
        self._pool_gates = tuple(source._release_bound for source in self.sources)  # Note [A named stream is ...]
        self.source = self.sources[0]  #: Where requests start; its ``allocate(size)`` is the path with no adaptor.
        self._config = config  # rule 13: captured allocations, and where allocations go while a capture is under way
        self._capture_pool: MemPool | None = None
        self.graph_blocks = GraphBlocks(cu, self._pool_for_captures, self.waits)
        router = CaptureRouter(cu, self.graph_blocks, self.source.allocate_block, self.mempool_blocks.allocate_on,
                               self.mempool_blocks.allocate_beside)
        for source in self.sources:
            source.capture_router = router.allocate

    def _pool_for_captures(self):
        """Captures' pool: the device's if not exportable, else one made at the first capture (relaxed mode)."""
        if not self.pool.exportable:
            return self.pool.handle
        if self._capture_pool is None:
            with relaxed(self.cu):
                self._capture_pool = MemPool(self.cu, self.pool.device_id, capture_pool_config(self._config), 0)
        return self._capture_pool.handle

    # -- the core's contract (:mod:`.block`) ---------------------------------------------------
    def allocate(self, nbytes: int, stream: StreamRef = LEGACY) -> Block:
        """A :class:`~.block.Block` of ``nbytes`` bytes for work on ``stream`` (RMM's, cuda.core's ``allocate``),
        freed by :meth:`deallocate`; the caller keeps ``stream`` alive until then.  No frontend or scope.
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` when the request cannot be met after synchronizing and
            trimming (:meth:`out_of_memory`); any other driver error (``cuMemAllocFromPoolAsync``) as returned."""
        return self.source.allocate_block(nbytes, stream)

    def deallocate(self, block: Block, stream: StreamRef | None = None) -> None:
        """Give ``block`` back (RMM, cuda.core), after a differing ``stream`` (rule 14: another thread's per-thread
        default stream differs too; Note [A named stream is not waited for]); once, never raising (rule 8)."""
        if stream is not None and not stream.same_stream(block.stream):
            self._name(block, stream)
        block.release(block)

    def _name(self, block: Block, stream: StreamRef) -> None:
        """Note [A named stream is not waited for]
            A release naming a stream S other than the block's allocation stream A must not make A wait for S (the
            release of rule 2 would): work of A issued later may be what S waits for (a kernel on S waiting for a
            copy on A would hang), and cuda.core's pool frees on S.  So a mempool block of a non-legacy A is freed
            on S (``cuMemFreeAsync`` there: reuse follows S's work so far, which the library's contract orders
            after the block's uses, as for cuda.core's pool); an arena block (its stream's domain takes it back)
            goes back after the next fence (rule 4), S named as a :class:`~.waits.Fenced` stream,
            once the host sees events on S and on A done (``cuEventQuery``; a later fence looks again): no stream,
            the legacy one included, waits for them.  Where A or S is the legacy stream the fence waits already
            (rule 2's path).  A graph block (rule 13) keeps rule 2's wait; a per-thread default stream of
            a thread other than the releasing one cannot be named (rule 8's synchronize instead)."""
        allocated_on = block.stream
        if stream is LEGACY or allocated_on is LEGACY or block.release not in self._pool_gates:
            self.waits.add_wait(block, stream)
        elif block.release is self.mempool_blocks._release_bound and type(stream) is StreamRef \
                and stream.thread is None and allocated_on.thread is None:
            block.stream = stream
        else:
            self.waits.add_wait(block, fenced(stream))

    def door_may_keep(self, block: Block, on_a_stream: bool) -> bool:
        """Whether a door's free list may keep ``block`` (Note [The doors' free lists]): never graph memory (rule 13:
        a capture's allocation node, which an allocation in the capturing thread gets, the legacy stream's too); for
        a stream other than the legacy one (``on_a_stream``), a mempool block only (rule 7), which no domain event
        covers (an arena block is its stream's domain's, rule 5)."""
        if on_a_stream:
            return block.release is self.mempool_blocks._release_bound
        return block.release in self._pool_gates

    def set_aside(self, block: Block, hold: SeenHold) -> None:
        """Release ``block`` (never used) now, ordered on its allocation stream while that lives, kept from reuse
        by ``hold`` until :meth:`let_go_after` (Note [An address a reset gave again] in
        :mod:`numba_pool.plugin.serving`); never raises (rule 8)."""
        self.waits.add_wait(block, hold)
        block.release(block)

    def let_go_after(self, hold: SeenHold, stream: StreamRef, what: str = "a block set aside") -> None:
        """The block ``hold`` keeps (a set-aside one, :meth:`set_aside`; a scratch block, :mod:`.scratch`) goes back
        after the next fence, once the host sees ``stream``'s work so far done; no stream waits for it.  Never raises
        (rule 8: a synchronize instead, warning of ``what``)."""
        if self.mempool_blocks.dropped:  # a reset freed the block (StreamWaits.release_held): record nothing
            hold.let_go()
            return
        self.waits.let_go_after(hold, stream, what)

    # -- what a release waits for (rule 2) --------------------------------------------------
    def _block_at(self, address: int) -> Block | None:
        for source in (self.mempool_blocks, *self.arenas):
            block = source.containing_block(address)
            if block is not None:
                return block
        return None

    def record_stream(self, address: int, stream: StreamRef) -> bool:
        """Rule 2 for the block at ``address`` (False if none); a carved scratch array applies it when dropped.
        A stream other than the legacy one is named :class:`~.waits.Fenced`: the block's stream does not wait for
        it (Note [A named stream is not waited for]); the host sees its work done, as PyTorch's ``record_stream``."""
        return self._add_wait(address, stream, named=True)

    def hold(self, address: int, hold: Hold) -> bool:
        """Keep the block holding ``address`` from reuse until ``hold`` lets go (IPC leases); False if none does."""
        return self._add_wait(address, hold)

    def export_hold(self, address: int, hold: Hold) -> bool:
        """:meth:`hold`, then ``cuCtxSynchronize``: another process orders against nothing of ours, and the driver
        needs the allocation complete ("Stream Ordered Memory Allocator", IPC); False if no live block holds it.
        :raises CudaAPIError: if the synchronize fails.  :raises RuntimeError: during a known capture (rule 13)."""
        self.refuse_during_capture("an IPC export (it synchronizes the context)")
        if not self.hold(address, hold):
            return False
        check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize (IPC export)")
        return True

    def _add_wait(self, address: int, what, named: bool = False) -> bool:
        # ``named``: ``what`` is a recorded stream, Fenced unless the legacy one (a scratch array's drop takes it as it
        # is: ScratchBlock._drop).
        block = self._block_at(address)
        if block is None:
            return False
        if named and what.same_stream(block.stream):  # its own stream orders it already
            return True
        scratch = self.scratch_blocks.get(block.address)
        if scratch is not None:
            return scratch.add_wait(address, what)
        if self._on_wait(block.start):  # a door kept it, freed by its library: given back now, no live block holds it
            return False
        self.waits.add_wait(block, fenced(what) if named and what is not LEGACY else what)
        return True

    def allocation_of(self, address: int) -> tuple[int, int] | None:
        """``(base, size)`` in bytes of the mempool allocation (block, or arena slab) holding the
        live block at ``address``, as ``cuMemPoolExportPointer`` accepts; else None."""
        block = self.mempool_blocks.containing_block(address)
        if block is not None:
            return block.address, block.size
        for arena in self.arenas:
            if arena.containing_block(address) is not None:
                return arena.slab_of(address)
        return None

    # -- figures ----------------------------------------------------------------------------
    def segments(self) -> list[dict]:
        """What this generation holds, for a snapshot (:func:`segments`)."""
        return segments(self)

    def issue_frees(self) -> None:
        """Before figures and barriers: run releases an ended capture held (rule 13), and free
        fenced mempool blocks (Note [Legacy-stream frees wait for a fence])."""
        with relaxed(self.cu):  # a capture numba_pool does not know of: cuEventQuery would invalidate a global one
            if captures.underway or captures.held_back():
                captures.refresh(self.cu)
            self.mempool_blocks.free_completed()

    def refuse_during_capture(self, what: str) -> None:
        """Rule 13: a synchronize breaks captures.  :raises RuntimeError: during one, naming ``what`` and the stream."""
        if captures.underway and captures.refresh(self.cu):
            streams = ", ".join(f"{c.stream.value:#x}" for c in list(captures.underway))
            raise RuntimeError(f"numba_pool: {what} cannot run while stream {streams} is being captured: "
                               "it would invalidate the capture; call it after cuStreamEndCapture")

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes: ``cuMemGetInfo`` free + unused pool/arena; with a cap: (<= cap - used, cap)."""
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
        """The one-line error of a failed allocation of ``size`` bytes, with the pool's figures."""
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
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` if the retry fails, :meth:`describe_out_of_memory`'s line."""
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
        """Snapshot released blocks (rule 4), ``cuCtxSynchronize``, free them and empty slabs (again for what the
        releases run meanwhile freed on the legacy stream), synchronize again, ``cuMemPoolTrimTo(keep_bytes)``,
        ``cuDeviceGraphMemTrim``.  :raises RuntimeError: during a capture (rule 13)."""
        self.refuse_during_capture("trim()")
        self.issue_frees()
        for _ in range(3):  # the releases run may free blocks on the legacy stream (a hold let go): those too
            if not self._free_released():
                break
        check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
        self.pool.trim(keep_bytes)
        if self._capture_pool is not None:
            self._capture_pool.trim(keep_bytes)
        trim_graph_memory(self.cu, self.pool.device_id)  # what no graph uses

    def _free_released(self) -> bool:
        """Rule 4's snapshot of released blocks, ``cuCtxSynchronize``, then they are freed (arena: slabs emptied) and
        the releases awaiting a fence run; True if there were any.  :raises CudaAPIError: the synchronize failed."""
        releases: list = []  # Note [The legacy stream recorded] in .waits: made free after the synchronize
        released = self.mempool_blocks.take_released(releases)
        arena_released = [arena.take_released(releases) for arena in self.arenas]
        check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
        self.mempool_blocks.free_idle(released)
        run_releases(releases)
        for arena, taken in zip(self.arenas, arena_released):
            arena.release_cached(taken)
        return bool(releases)

    def reset(self) -> None:
        """Free everything (snapshot, then synchronize): later finalizers find nothing, allocations under way go to the
        next generation; the pool is trimmed to 0, destroyed with this generation (an allocation may still name it)."""
        releases: list = []  # Note [The legacy stream recorded] in .waits: made free after the synchronize
        pointers = self.mempool_blocks.take_all() + [block.ptr for block in self.mempool_blocks.take_released(releases)]
        for arena in self.arenas:
            arena.fences.take_all(releases)
            pointers += [self.cu.CUdeviceptr(start) for start, _ in arena.drop_all()]
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
        late: list = []  # What those released (later ones free themselves).
        pointers += [block.ptr for block in self.mempool_blocks.take_released(late)]
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
    """Snapshot segments: ``kind`` (``"arena slab"``, ``"scratch"``, ``"mempool"``, ``"mempool reserve"``: reserved
    minus the rest), ``address``, ``size`` (bytes), ``stream`` (0: legacy), ``blocks`` as ``(address, size, state)``."""
    allocator.issue_frees()
    out = []
    slab_starts = set()
    for arena in allocator.arenas:
        for start, size, key, blocks in arena.layout():
            slab_starts.add(start)
            out.append({"kind": "arena slab", "address": start, "size": size,
                        "stream": key if isinstance(key, int) else 0, "blocks": blocks})
    for block in allocator.mempool_blocks.blocks():
        start, size = block.address, block.size
        if start in slab_starts:
            continue  # the arena's slab (its Block is the slab's allocation)
        kind = "scratch" if start in allocator.scratch_blocks else "mempool"
        out.append({"kind": kind, "address": start, "size": size, "stream": 0,
                    "blocks": [(start, size, block.state)]})
    held = sum(segment["size"] for segment in out)
    reserve = allocator.pool.usage().reserved - held
    if reserve > 0:
        out.append({"kind": "mempool reserve", "address": 0, "size": reserve, "stream": 0,
                    "blocks": [(0, reserve, "free")]})
    return out


def destroy_when_collected(holder, pool: MemPool, owner: OwnerContext) -> None:
    """Destroy ``pool`` once ``holder`` is garbage, in the owner's context; not at exit."""
    weakref.finalize(holder, _destroy_pool, pool, owner).atexit = False


def destroy_now(pool: MemPool, owner: OwnerContext) -> None:
    """Destroy ``pool`` now, in the owner's context; a failure is not raised."""
    _destroy_pool(pool, owner)


def _destroy_private(streams, fences, owner: OwnerContext) -> None:
    def destroy(*_):  # a reset generation's private streams and fence events, once nothing can reach them
        for stream in streams:
            stream.destroy()
        for each in fences:
            each.destroy()
    owner.enter(destroy)


def _destroy_pool(pool: MemPool, owner: OwnerContext) -> None:
    def destroy(*_):  # a reset generation's pool, once its allocator is collected, in the owner's context
        with contextlib.suppress(CudaAPIError):
            pool.destroy()
    owner.enter(destroy)
