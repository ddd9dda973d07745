"""Blocks whose next owner may be the CPU: pinned/mapped host memory (``NUMBA_POOL_HOST``) and managed memory
(``NUMBA_POOL_MANAGED``), cached under **the host rule** (rule 9 of :mod:`numba_pool.allocator`).  Numba's
``memhostalloc`` (``pinned_array``, ``mapped_array``, ``pinned()``) and ``memallocmanaged`` (``managed_array``) allocate
and free per buffer (``cuMemHostAlloc``/``cuMemFreeHost``, ``cuMemAllocManaged``/``cuMemFree``: ~25 µs a pair, the free
synchronizing the device: Note [Managed blocks are not from a mempool]).  Contract and release gate: the device blocks'
(:mod:`.block`, ``ref`` the :class:`HostBlock`; :mod:`.release`).  Threads: releases take no lock; allocation, trim and
reset bin and fence the released blocks under the lock.  :class:`HostBlocks` caches freed blocks (as PyTorch's
``CachingHostAllocator``, CuPy's ``PinnedMemoryPool``), new ones from its *backing* (:mod:`.backings`):

* n bytes take a block of the next power of two (at least :data:`MIN_BLOCK` bytes) from a bin keyed by
  ``(flags, rounded size)``: mapped (``CU_MEMHOSTALLOC_DEVICEMAP``), portable and write-combined blocks never
  serve each other (not from a host-located mempool: ``cuMemHostGetDevicePointer`` fails on its memory);
* **the host rule**: a release records events on its :func:`numba_pool.record_stream` streams and its allocation
  stream (unless legacy: a later fence, Note below); a cached block is reused, or returned to its backing, only
  once fenced and its events *completed as the host sees* (``cuEventQuery``), or after ``cuCtxSynchronize``;
* over the cap (``NUMBA_POOL_HOST_MAX_SIZE``, ``NUMBA_POOL_MANAGED_MAX_SIZE``) an allocation waits for
  (``cuEventSynchronize``) and frees the oldest cached blocks, else raises ``CUDA_ERROR_OUT_OF_MEMORY`` with
  the sizes; beyond ``NUMBA_POOL_{HOST,MANAGED}_RELEASE_THRESHOLD`` cached bytes, completed blocks go back.

Note [A release records nothing on the legacy stream]
    A block allocated outside ``using_stream`` may be used on any blocking stream: only a legacy-stream operation or a
    synchronize orders its release, and one per release was a barrier that deadlocked cross-stream waits (issue 33).  So
    a release makes no driver call: the block joins :attr:`HostBlocks.released` unfenced; an allocation records one
    legacy-stream fence per batch once :data:`~.fences.FENCE_BLOCKS` blocks or :data:`~.fences.HOST_FENCE_BYTES` bytes
    wait outside ``defer_cleanup`` (:class:`~.fences.HostFences`, rule 4); a synchronize (trim, reset) idles them."""

from __future__ import annotations

import contextlib
import itertools
import threading
from functools import partial
from collections import deque
from dataclasses import dataclass, field

from cuda.bindings import driver as _cuda

from ..cuda.capture import relaxed
from ..cuda.context import OwnerContext
from ..cuda.driver import EVENT_FLAGS, OUT_OF_MEMORY, SUCCESS, check, report_failure, warn
from ..cuda.errors import CudaAPIError, api_error
from ..cuda.streams import LEGACY, StreamRef
from . import captures
from .backings import DEVICEMAP, PinnedBacking
from .block import ALLOCATED, AWAITING_FREE, Block, add_wait, make_block, take_waits
from .fences import HostFences
from .held import Held
from .release import Pending, gate
from .waits import Deferral

MIN_BLOCK = 512  #: The smallest block (bytes): every request is rounded up to a power of two at least this.
#: ``cuMemHostAlloc`` flags (CUDA Driver API, ``CU_MEMHOSTALLOC_*``; ``DEVICEMAP`` from :mod:`.backings`).
PORTABLE = int(_cuda.CU_MEMHOSTALLOC_PORTABLE)
WRITECOMBINED = int(_cuda.CU_MEMHOSTALLOC_WRITECOMBINED)
QUERY_LIMIT = 8  #: Cached blocks of one bin whose events are queried per allocation before a new block is made.


def host_flags(mapped: bool, portable: bool, wc: bool) -> int:
    """The ``cuMemHostAlloc`` flags of Numba's ``memhostalloc(size, mapped, portable, wc)``."""
    return (DEVICEMAP if mapped else 0) | (PORTABLE if portable else 0) | (WRITECOMBINED if wc else 0)


def block_size(size: int) -> int:
    """The block (bytes) for ``size`` bytes: the next power of two, at least :data:`MIN_BLOCK`."""
    return max(MIN_BLOCK, 1 << (max(size, 1) - 1).bit_length())


@dataclass(eq=False)
class HostBlock:
    """A cached block: host/device address (mapped, managed), rounded bytes, ``cuMemHostAlloc`` flags, events, order."""

    host: int
    device: int | None
    size: int
    flags: int
    events: list = field(default_factory=list)
    order: int = 0
    orphan: bool = False  # outlived reset() of a backing that frees orphans: freed at release, as Numba does
    generation: int = 0  # the cache's generation (resets so far) that counts it in reserved
    handle: object = None  # its CUdeviceptr, made once (managed blocks: what the pointer holds)
    fenced: bool = False  # its owner's blocking-stream work is covered: by ``fence``, or a synchronize
    fence: object = None  # the SharedFence of its batch (one legacy-stream event for the batch), or None
    record: object = None  # its Block, made at its first allocation and handed out again with it


class HostBlocks:
    """One manager's cache of pinned or managed blocks (the host rule): ``max_size`` caps reserved bytes,
    ``release_threshold`` the cached bytes kept (None: no limit); ``deferral``: its ``defer_cleanup`` state."""

    def __init__(self, cu, *, max_size: int | None = None, release_threshold: int | None = None,
                 owner: OwnerContext | None = None, backing=None, deferral: Deferral | None = None):
        self._cu = cu
        self.backing = backing if backing is not None else PinnedBacking(cu)
        self.owner = owner if owner is not None else OwnerContext(cu, None)  # rule 10
        self.max_size = max_size
        self.release_threshold = release_threshold
        self._lock = threading.Lock()
        self._waits_lock = threading.Lock()  # record_stream's registrations (never held across a driver call)
        self.deferral = deferral if deferral is not None else Deferral()
        self.live: dict[int, Block] = {}  # host address -> Block handed out (their ledger; ``ref``: the HostBlock)
        self.released = Pending()  # Blocks released, their HostBlocks not yet in a bin
        self.held = Held()  # Blocks released, held back by defer_cleanup
        self.bins: dict[tuple[int, int], deque[HostBlock]] = {}  # (flags, size) -> oldest first
        self.fences = HostFences(cu, self._record, self.backing.kind)  # the unfenced blocks; under the lock
        self.fences.deferral = self.deferral
        self._free_events: list = []
        self._order = itertools.count(1)
        self.reserved = 0  # bytes from the backing not yet given back (this generation)
        self.cached = 0  # bytes of blocks in the bins
        self.generation = 0  # resets so far
        self._release = gate(self, cu, deferral=self.deferral, owner=self.owner,
                             ordered=self._ordered, pending=self.released, ledger=True, orphaned=self._orphaned)

    # -- allocation (under the lock) ---------------------------------------------------------
    def allocate_block(self, size: int, stream: StreamRef = LEGACY, flags: int = 0) -> Block:
        """The core's contract (:mod:`.block`): a :class:`~.block.Block` of ``size`` bytes (``ptr``: the host
        address, an int; ``ref``: its :class:`HostBlock`, rounded up) with ``cuMemHostAlloc`` ``flags`` (0 for
        managed blocks), whose release waits for its allocation ``stream`` and (the host rule) the host.
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` (one line with the sizes) when the cap or the
            backing cannot give the block even after freeing every cached block; any other driver error."""
        rounded = block_size(size)
        if captures.underway and captures.refresh(self._cu):
            with relaxed(self._cu), self._lock:  # rule 13: relaxed mode; nothing goes back to the backing until it ends
                return self._allocate(size, rounded, flags, stream)
        with self._lock:  # Note [A lock without nullcontext]
            return self._allocate(size, rounded, flags, stream)

    def deallocate(self, block: Block, stream: StreamRef | None = None) -> None:
        """Give ``block`` back, after ``stream`` if not ``block.stream`` (rule 2); once, never raising (rule 8)."""
        if stream is not None and not stream.same_stream(block.stream):
            self.record_stream(block.ptr, stream)
        block.release(block)

    def _allocate(self, size: int, rounded: int, flags: int, stream: StreamRef) -> Block:
        self._take_released()
        self.fences.fence_if_due(captures.underway)
        cached = self._take_cached(flags, rounded) or self._new_block(size, rounded, flags)
        block = cached.record  # no Block() per allocation (as Note [A ready block is its Block] in .arena)
        if block is None:
            block = cached.record = make_block(cached.host, size, stream, self._release)
            block.ref = cached
        else:  # its release took its waits and left it awaiting free
            block.size, block.stream, block.state = size, stream, ALLOCATED
        block.ledger = self.live
        self.live[cached.host] = block
        return block

    def _take_released(self) -> None:
        for released in self.released.take():
            block = released.ref
            block.order = next(self._order)
            if block.generation != self.generation:  # its release straddled a reset: count it here
                block.generation = self.generation
                self.reserved += block.size
            bin_ = self.bins.get((block.flags, block.size))
            if bin_ is None:
                bin_ = self.bins[(block.flags, block.size)] = deque()
            bin_.append(block)
            self.cached += block.size
            self.fences.add(block)
        if self.release_threshold is not None and self.cached > self.release_threshold and not captures.underway:
            self._free_completed(self.release_threshold)

    def _take_cached(self, flags: int, rounded: int) -> HostBlock | None:
        bin_ = self.bins.get((flags, rounded))
        if not bin_:
            return None
        block = bin_[0]
        if self._completed(block):  # the oldest, most often done: popleft, no islice
            bin_.popleft()
        else:
            for block in itertools.islice(bin_, 1, QUERY_LIMIT):
                if self._completed(block):
                    bin_.remove(block)
                    break
            else:
                return None
        self.cached -= block.size
        self._recycle_events(block)
        return block

    def _completed(self, block: HostBlock) -> bool:
        """``block`` is fenced and all its release's events completed, as the host sees (``cuEventQuery``)."""
        if not block.fenced:
            return False
        query = self._cu.cuEventQuery
        if block.fence is not None and query(block.fence.event)[0] != SUCCESS:
            return False
        for event in block.events:
            if query(event)[0] != SUCCESS:
                return False
        return True

    def _new_block(self, size: int, rounded: int, flags: int) -> HostBlock:
        if self.max_size is not None and self.reserved + rounded > self.max_size and not captures.underway:
            self._free_oldest(self.max_size - rounded)
        if self.max_size is not None and self.reserved + rounded > self.max_size:
            raise out_of_memory_error(self, size, rounded, flags, "the cap")
        got = self.backing.allocate(rounded, flags)
        if got is None and not captures.underway:
            self._free_oldest(0)
            got = self.backing.allocate(rounded, flags)
            if got is None:
                raise out_of_memory_error(self, size, rounded, flags, self.backing.refused_by())
        self.reserved += rounded
        return HostBlock(got[0], got[1], rounded, flags, generation=self.generation)

    # -- giving memory back (under the lock) -------------------------------------------------
    def _cached_oldest_first(self) -> list[HostBlock]:
        return sorted((b for bin_ in self.bins.values() for b in bin_), key=lambda b: b.order)

    def _free_oldest(self, down_to: int) -> None:
        """Fence, then free the oldest cached blocks after ``cuEventSynchronize`` down to ``down_to`` reserved bytes."""
        deferral = self.fences.deferral
        if self.fences.unfenced and (deferral is None or not deferral.depth):
            # Over the cap, a barrier (never in defer_cleanup): unfenced blocks, binned before it, are idle after it.
            check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize (host cache over its cap)")
            self.fences.synchronized()
        for block in self._cached_oldest_first():
            if not block.fenced:  # its owner's blocking-stream work is not known done
                continue
            if self.reserved <= down_to:
                return
            for event in ([block.fence.event] if block.fence is not None else []) + block.events:
                check(self._cu.cuEventSynchronize(event), "cuEventSynchronize (host block)")
            self._free_cached(block)

    def _free_completed(self, keep: int) -> int:
        """Free completed cached blocks, oldest first, until cached <= ``keep`` bytes; return the bytes freed."""
        freed = 0
        for block in self._cached_oldest_first():
            if self.cached <= keep:
                break
            if self._completed(block):
                freed += block.size
                self._free_cached(block)
        return freed

    def _free_cached(self, block: HostBlock) -> None:
        self.bins[(block.flags, block.size)].remove(block)
        self.fences.discard(block)  # after a synchronize (reset)
        self.cached -= block.size
        self.reserved -= block.size
        self._recycle_events(block)
        report_failure(self.backing.free(block.host), f"freeing a {self.backing.kind} block")

    def _recycle_events(self, block: HostBlock) -> None:
        self._free_events.extend(block.events)
        block.events = []
        HostFences.let_go(block, self._free_events)
        block.fenced = False

    def trim(self) -> int:
        """Free every completed cached block, the unfenced too (binned, then ``cuCtxSynchronize``), and trim the
        backing; return the bytes freed.  :raises CudaAPIError: when a synchronize or the backing's trim fails."""
        with self._lock:
            self._take_released()
            if self.fences.unfenced:  # the snapshot before the synchronize (rule 4)
                check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize (host trim)")
                self.fences.synchronized()
            freed = self._free_completed(0)
            self.backing.trim()
            return freed

    def reset(self) -> None:
        """Free cached blocks after ``cuCtxSynchronize`` as the owner (rule 10), snapshot first (rule 4); live blocks
        are orphans freed at release (pinned) or come back (managed): freeing under a live NumPy array crashes."""
        self.owner.enter(self._reset)

    def _reset(self, retry: bool) -> None:  # OwnerContext.enter's signature
        with self._lock:
            self._take_released()
            report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize (host reset)")
            for block in self._cached_oldest_first():
                self._free_cached(block)
            with contextlib.suppress(CudaAPIError):
                self.backing.trim()
            if self.backing.frees_orphans:
                orphan_live_blocks(self)
                self.reserved = 0
                self.generation += 1
            events = self._free_events
            while events:  # pop, not a loop over the list: a release may pop one meanwhile
                try:
                    event = events.pop()
                except IndexError:
                    break
                report_failure(self._cu.cuEventDestroy(event), "cuEventDestroy")

    # -- release (no lock: finalizers) ---------------------------------------------------------
    def record_stream(self, address: int, stream: StreamRef) -> bool:
        """Make the release of the live block at host or device ``address`` wait for ``stream``; False if none."""
        for block in list(self.live.values()):
            cached = block.ref
            for base in (cached.host,) if cached.device in (None, cached.host) else (cached.host, cached.device):
                if base <= address < base + cached.size:
                    with self._waits_lock:
                        add_wait(block, stream)
                    return True
        return False

    # The release gate puts an unrecorded legacy-stream block in ``released``; others come here: events on non-legacy
    # streams now, into ``released`` now or when defer_cleanup lets go (Note [A release made free later orders now],
    # .waits), else cuCtxSynchronize.  Note [A release records nothing on the legacy stream].

    def _ordered(self, block: Block) -> None:
        streams = [] if block.stream is LEGACY else [block.stream]
        streams += [ref for ref in take_waits(block) if ref is not LEGACY]
        block.stream = LEGACY  # a released block keeps no stream (nor the object that owns it) alive
        if not streams and not self.deferral.depth:
            self._put_back(block)
            return
        self.owner.enter(self._record_release, block, streams)  # rule 10

    def _orphaned(self, block: Block) -> bool:
        if not block.ref.orphan:  # rule 12: a reset marked it (before or after the gate's pop): freed as Numba does
            return False
        self._free_orphan(block.ref, True)
        return True

    def _free_orphan(self, block: HostBlock, retry: bool) -> None:
        result = self.backing.free(block.host)
        if result[0] != SUCCESS and retry and self.owner.retry(self._free_orphan, block):  # rule 10
            return
        report_failure(result, f"freeing a {self.backing.kind} block (after reset)")

    def _record_release(self, block: Block, streams, retry: bool) -> None:
        cached, events = block.ref, []
        try:
            for stream in streams:
                events.append(self._record(stream))
            cached.events = events
        except Exception as err:  # noqa: BLE001 - a release never raises
            self._free_events.extend(events)  # those recorded before the failure: reused, not leaked
            cached.events = []
            if retry and self.owner.retry(self._record_release, block, streams):  # rule 10
                return
            if not report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize"):
                return
            cached.fenced = True  # nothing earlier remains after the synchronize
            warn(f"could not order the release of {self.backing.kind} block {cached.host:#x} ({err}); "
                 "synchronized the device instead")
        if not self.deferral.depth:
            self._put_back(block)
            return
        self.held.keep(block)  # before defer: the block is never neither held, released nor live
        if not self.deferral.defer(partial(self._put_back, block)):
            self._put_back(block)

    def _put_back(self, block: Block) -> None:  # into ``released``, awaiting free (unheld, if defer_cleanup held it)
        self.held.let_go(block)
        block.state = AWAITING_FREE
        self.released.append(block)

    def _record(self, stream: StreamRef):
        if stream.thread is not None and stream.belongs_to_another_thread():
            raise RuntimeError("a stream recorded for it is another thread's per-thread default stream")
        try:
            event = self._free_events.pop()
        except IndexError:
            event = check(self._cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate (host block)")
        result = self._cu.cuEventRecord(event, stream.handle)
        if result[0] != SUCCESS:
            self._free_events.append(event)
            check(result, "cuEventRecord (host block)")
        return event

    def segments(self) -> list[dict]:
        """Snapshot segments, one per reserved block: ``kind``, ``address``, ``size`` (bytes), ``stream`` 0, ``blocks``
        ``[(address, size, state)]`` (``"allocated"``: live or deferred, ``"awaiting_free"``, ``"free"``); locks.
        In relaxed capture mode (rule 13): a snapshot during a global capture queries the cached blocks' events."""
        with self._lock, relaxed(self._cu):
            self._take_released()
            live = [(b, "allocated") for b in [*live_now(self), *held_now(self)]]
            cached = [(b, "free" if self._completed(b) else "awaiting_free")
                      for bin_ in self.bins.values() for b in bin_]
            return [{"kind": self.backing.kind, "address": b.host, "size": b.size, "stream": 0,
                     "blocks": [(b.host, b.size, state)]} for b, state in live + cached]

    def check_invariants(self) -> None:
        """in use + cached + released == reserved; no block live and cached, or twice.  :raises AssertionError: else."""
        with self._lock:
            self._take_released()
            cached = [b for bin_ in self.bins.values() for b in bin_]
            hosts = [b.host for b in cached] + list(self.live)
            assert len(hosts) == len(set(hosts)), f"a host block is cached and live, or cached twice: {hosts}"
            assert self.cached == sum(b.size for b in cached), (self.cached, cached)
            in_use = sum(b.size for b in [*live_now(self), *held_now(self)])
            released = sum(b.ref.size for b in list(self.released) if b.ref.generation == self.generation)
            assert in_use + self.cached + released == self.reserved, (in_use, self.cached, released, self.reserved)


def orphan_live_blocks(cache: HostBlocks) -> None:
    """A reset's live blocks become orphans, freed at release (cache lock held).  Marked, then popped: a racing
    release sees the mark, or popped first and keeps it unmarked; swapping the table first lost blocks."""
    live = cache.live.copy()
    for block in live.values():
        block.ref.orphan = True
    for host, block in live.items():
        if cache.live.pop(host, None) is None:  # released meanwhile: cached, counted again
            block.ref.orphan = False


def out_of_memory_error(cache: HostBlocks, size: int, rounded: int, flags: int, refused_by: str) -> CudaAPIError:
    """The one line of a host or managed allocation of ``size`` bytes (a block of ``rounded``) that
    ``refused_by`` refused after the cached blocks were freed: the cap, reserved, in-use and cached bytes."""
    backing = cache.backing
    cap = f"capped at {cache.max_size} bytes ({backing.cap_variable})" if cache.max_size is not None else "uncapped"
    in_use = sum(b.size for b in live_now(cache))
    what = backing.describe(flags).format(size=size, rounded=rounded)
    return api_error(OUT_OF_MEMORY, (
        f"numba_pool: out of {what} after waiting for and freeing the cached blocks: refused by "
        f"{refused_by}; {backing.kind} pool {cap} reserves {cache.reserved} bytes, {in_use} in use, "
        f"{cache.cached} cached"))


def live_now(cache: HostBlocks) -> list[HostBlock]:
    """The cached records of the blocks handed out now (a copy)."""
    return [b.ref for b in cache.live.copy().values()]


def held_now(cache: HostBlocks) -> list[HostBlock]:
    """Released blocks that ``defer_cleanup`` holds back, of this generation."""
    return [b.ref for b in cache.held.values() if b.ref.generation == cache.generation]


def statistics(cache: HostBlocks) -> dict:
    """``{host,managed}_reserved_bytes``, ``_in_use_bytes`` (+deferred), ``_cached_bytes`` (+unbinned), ``_blocks``."""
    live = live_now(cache) + held_now(cache)
    pending = sum(b.ref.size for b in list(cache.released))
    cached_blocks = sum(len(b) for b in list(cache.bins.values())) + len(cache.released)
    prefix = cache.backing.prefix
    return {f"{prefix}_reserved_bytes": cache.reserved, f"{prefix}_in_use_bytes": sum(b.size for b in live),
            f"{prefix}_cached_bytes": cache.cached + pending, f"{prefix}_blocks": len(live) + cached_blocks}
