"""Stream ordering: the one place that decides when memory may be handed out again.

The rule
--------
**A block is never handed to work that can run before the last use of its previous owner has
finished.**

Every block is allocated on an *allocation stream* S: the thread's :func:`numba_pool.using_stream`
stream, else the legacy default stream.  Its owner's work may run on S; on any blocking stream
when S is the legacy stream (the legacy stream orders with every blocking stream, both ways:
CUDA Runtime API, "stream synchronization behavior"); and on any stream registered with
:func:`numba_pool.record_stream`.  Other use must be ordered by the program (README, "Stream
semantics"), as with any stream-ordered allocator.

Invariants, kept by the code below and checked in CI by a model of CUDA's stream ordering that
runs this code against random legal programs (``tests/cuda_model.py``, ``tests/test_fuzz.py``):

1. **A block never changes stream.**  Free arena blocks belong to the *domain* of one stream,
   their previous owner's allocation stream, and an allocation on S takes blocks of S's domain
   only.  Memory moves between streams only through the mempool, whose driver orders it: a
   wholly free slab goes back with ``cuMemFreeAsync`` and the pool hands it to another stream
   only after that free ("Stream Ordered Memory Allocator", reuse policies).  The rule of
   PyTorch's caching allocator and CuPy's pool.
2. **Releases wait for recorded streams.**  Before a block leaves its owner, S waits on the
   device (``cuStreamWaitEvent``) for an event recorded on each stream registered for it.  Then
   everything its owner's work did is ordered before S's later work.
3. **A block of a domain other than the legacy one is free for S at once**: S runs the next
   owner's work after the previous owner's.
4. **The legacy domain fences.**  A block freed on the legacy stream may still be read by work
   on a blocking stream that the next owner's work, on another blocking stream, would not wait
   for.  It waits in *quarantine* until a *fence*, one operation on the legacy stream (an event
   record), which runs after all earlier work of every blocking stream and before all later
   work.  **The snapshot comes before the barrier**: a fence releases only the blocks it took
   out of quarantine before it was recorded; a block freed meanwhile waits for the next fence.
   Barriers that synchronize (trim, out of memory, reset) take their snapshot first too.
5. **A domain's event covers every block in it.**  The domain of a stream S other than the
   legacy one has an event, recorded on S after each release (and after each slab taken on S)
   and before the block is published.  A slab goes back to the mempool on the legacy stream
   after waiting for that event, so numba_pool never enqueues on S after its last release: S
   may be destroyed by then.
6. **Domains are keyed by the driver's stream id** (``cuStreamGetId``, unique for the life of
   the process), never by handle value: a new stream that gets a destroyed stream's handle gets
   a new domain.
7. **Mempool blocks** (arena off, or larger than its largest block) are freed with
   ``cuMemFreeAsync`` on their allocation stream after rule 2; the driver's pool keeps the rule
   from there.
8. **A release never raises.**  Where it cannot order (a stream was destroyed, a per-thread
   default stream belongs to another thread, the driver refused), it falls back to the default
   manager's guarantee: ``cuCtxSynchronize``, after which no earlier work remains, then the
   block is free; a warning says so.  Inside ``defer_cleanup`` releases are held back and done,
   by these rules, when the outermost block exits.
9. **Host blocks wait for the host** (pinned and mapped memory, ``NUMBA_POOL_HOST``; code in
   :mod:`numba_pool.host`, kept apart because it shares no domain, arena or mempool with the
   rules above).  The next owner of a host block is the CPU, which writes it at once, so stream
   order is not enough: at release an event is recorded on the legacy stream (after all work of
   blocking streams) and on each stream registered with ``record_stream`` (non-blocking streams
   need it, as for device blocks), and the block is handed out again only once every one of
   those events has *completed as the host observes it* (``cuEventQuery`` returns
   ``CUDA_SUCCESS``); otherwise a new block is allocated.  Blocks are freed
   (``cuMemFreeHost``) only after their events completed (``cuEventSynchronize`` when over the
   cap) or after ``cuCtxSynchronize`` (reset).  Checked by ``tests/test_host_ordering.py``.
10. **A release runs in its owner's context.**  A finalizer may run in a thread with no current
    context (one that never used CUDA), or with another device's (there handle 0 is *that*
    device's legacy stream, which orders nothing here).  A release that fails for want of a
    context, and where the process sees two devices or more every release that makes a driver
    call and finds another context current, pushes the owner's context first (:class:`~numba_pool.driver.OwnerContext`).  The arena's
    legacy releases make no driver call: their fence runs at an allocation, in the context.

Threads: releases run in finalizers, in any thread, even inside an allocation the garbage
collector interrupted.  So they take no lock: each step is one atomic ``dict``/``list``/``deque``
operation, and work that needs the arena's lock is published to a queue that the next
allocation applies.  Everything else in the arena runs under its lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from functools import partial
from typing import Callable

from numba.cuda.cudadrv.driver import CudaAPIError

from .arena import ALIGNMENT, ArenaError, ArenaStatistics, Heap, round_up
from .config import KEEP_ALL
from .driver import EVENT_FLAGS, OUT_OF_MEMORY, OwnerContext, check, report_failure, warn
from .mempool import MemPool
from .pointer import PoolPointer
from .streams import LEGACY, StreamRef, _state, scopes_entered

#: Quarantine at most this many blocks before a fence, whatever their bytes.
QUARANTINE_BLOCKS = 256
#: A legacy-stream allocation that misses the ready cache fences once this many blocks are
#: quarantined, refilling the cache: one fence (a driver call) per about this many allocations.
REFILL_AT = 32
#: Ready blocks kept per size in the cache in front of the legacy domain.
CACHE_BLOCKS = 64
#: The first slab's size (bytes), unless the largest slab is smaller.
FIRST_SLAB = 64 << 10
#: A new slab is about 1/GROWTH of what the arena reserves already: slabs grow with the arena,
#: so the last, partly used slab stays a small fraction of the total (~3%).
GROWTH = 32
#: A new slab holds at least this many blocks of the request that needs it, so that a workload
#: of one block size does not fence (or take a slab) at every allocation.
BLOCKS_PER_SLAB = 64


class CannotOrder(RuntimeError):
    """A release that cannot be ordered on the device (rule 8's fallback follows)."""


class StreamWaits:
    """Rules 2 and 8, shared by both block sources: ``record_stream``'s registry, the releases
    held back by ``defer_cleanup``, and the synchronize fallback.

    ``recorded`` (block start -> streams) and ``held_back`` take atomic operations only;
    ``depth`` changes under ``_lock``.
    """

    def __init__(self, cu, owner: OwnerContext | None = None):
        self._cu = cu
        self.owner = owner if owner is not None else OwnerContext(cu, None)
        self.recorded: dict[int, list[StreamRef]] = {}
        self.depth = 0
        self.held_back: deque = deque()
        self._lock = threading.Lock()

    def record(self, start: int, stream: StreamRef) -> None:
        """Make the release of the block starting at ``start`` wait for ``stream``'s work."""
        self.recorded.setdefault(start, []).append(stream)

    def release(self, start: int, stream: StreamRef, publish: Callable[[bool], None]) -> None:
        """Release a block allocated on ``stream``: now or, inside ``defer_cleanup``, at its
        outermost exit.  ``publish(synchronized)`` makes the block free (it may raise; then
        the fallback synchronizes and calls ``publish(True)``).  Never raises."""
        if self.depth:
            self.held_back.append(partial(self._release_now, start, stream, publish))
            if not self.depth:  # the block exited while we were appending: flush ourselves
                self.flush()
            return
        self._release_now(start, stream, publish)

    def _release_now(self, start: int, stream: StreamRef, publish: Callable[[bool], None]) -> None:
        recorded = self.recorded.pop(start, None) if self.recorded else None
        self.owner.enter(self._order, start, stream, publish, recorded)  # rule 10

    def _order(self, start: int, stream: StreamRef, publish: Callable[[bool], None],
               recorded: list[StreamRef] | None, retry: bool) -> None:
        try:
            if stream.thread is not None and stream.thread != threading.get_ident():
                raise CannotOrder("it was allocated on another thread's per-thread default stream")
            if recorded:
                self._wait_for(recorded, stream)
            publish(False)
        except Exception as err:  # noqa: BLE001 - rule 8: a release never raises
            if retry and self.owner.retry(self._order, start, stream, publish, recorded):  # rule 10
                return
            self._synchronize_instead(start, stream, publish, err)

    def order_now(self, recorded: list[StreamRef], stream: StreamRef) -> None:
        """Make ``stream``'s later work wait for the work queued on each ``recorded`` stream by
        now (an event recorded on each, waited for by ``stream``).  For a scratch array, whose
        block is released later: its recorded streams may be destroyed by then.  Never raises
        (rule 8: the fallback synchronizes)."""
        self.owner.enter(self._order_now, recorded, stream)  # rule 10

    def _order_now(self, recorded: list[StreamRef], stream: StreamRef, retry: bool) -> None:
        try:
            if stream.thread is not None and stream.thread != threading.get_ident():
                raise CannotOrder("the block is on another thread's per-thread default stream")
            self._wait_for(recorded, stream)
        except Exception as err:  # noqa: BLE001 - rule 8
            if retry and self.owner.retry(self._order_now, recorded, stream):  # rule 10
                return
            if report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize"):
                warn(f"could not order a scratch array's recorded streams on stream {stream.value:#x} "
                     f"({err}); synchronized the device instead")

    def _wait_for(self, recorded: list[StreamRef], stream: StreamRef) -> None:
        cu = self._cu
        for ref in recorded:
            if ref.thread is not None and ref.thread != threading.get_ident():
                raise CannotOrder("a stream recorded for it is another thread's per-thread default stream")
            if ref.value == stream.value and ref.thread == stream.thread:
                continue
            event = check(cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate")
            try:
                check(cu.cuEventRecord(event, ref.handle), "cuEventRecord (record_stream)")
                check(cu.cuStreamWaitEvent(stream.handle, event, 0), "cuStreamWaitEvent (record_stream)")
            finally:
                cu.cuEventDestroy(event)  # the driver keeps it until the wait is done

    def _synchronize_instead(self, start: int, stream: StreamRef, publish, err: Exception) -> None:
        if not report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize"):
            return  # the context is gone, and the memory with it
        warn(f"could not order the release of block {start:#x} on stream {stream.value:#x} ({err}); "
             "synchronized the device instead")
        try:
            publish(True)
        except Exception as again:  # noqa: BLE001
            warn(f"could not release block {start:#x} after synchronizing: {again}")

    @contextlib.contextmanager
    def holding_back(self):
        """While active, releases are held back; the outermost exit does them."""
        with self._lock:
            self.depth += 1
        try:
            yield
        finally:
            with self._lock:
                self.depth -= 1
                done = self.depth == 0
            if done:
                self.flush()

    def flush(self) -> None:
        while True:
            try:
                release = self.held_back.popleft()
            except IndexError:
                return
            release()


def _bind_source(source, cu, pool_handle, context, waits: StreamWaits, usage, on_out_of_memory) -> None:
    """What both block sources hold: the pool and its hot-path allocation call (bound once),
    the pointers' context, the shared waits, the usage tracker's event append and drain, and
    the out-of-memory handler."""
    source._alloc_async = cu.cuMemAllocFromPoolAsync
    source._pool = pool_handle
    source._context = context
    source._waits = waits
    source._note = usage.events.append
    source._drain_if_due = usage.drain_if_due
    source._on_out_of_memory = on_out_of_memory


class PooledBlocks:
    """Rule 7: blocks straight from the mempool (``cuMemAllocFromPoolAsync`` and
    ``cuMemFreeAsync`` on the allocation stream).

    ``ledger`` maps each live allocation's ``CUdeviceptr`` (by identity: no ``int()`` on the hot
    path) to its size; :meth:`take_all` swaps in a new one, so a finalizer that outlives a reset
    finds nothing to free.
    """

    def __init__(self, cu, pool_handle, context, waits: StreamWaits, usage, on_out_of_memory):
        _bind_source(self, cu, pool_handle, context, waits, usage, on_out_of_memory)
        self._free_async = cu.cuMemFreeAsync
        self.ledger: dict = {}
        # Bound once: a bound method made per allocation cost 0.1 µs (bench).
        self._release_bound = self._release
        # Requests inside a scratch scope: the manager sets its scratch path.
        self.in_scratch: Callable[[StreamRef, int], PoolPointer] = self._no_scratch

    def allocate(self, size: int) -> PoolPointer:
        """The EMM plugin's ``memalloc`` in mempool mode (and the arena's :attr:`delegate`):
        ``size`` bytes on the thread's allocation stream, freed on it when the pointer is
        released.  Inside ``numba_pool.scratch`` the request goes to :attr:`in_scratch`.  The
        manager binds this method itself: a dispatching call in between cost 0.25 µs per
        allocation (``numba-pool bench --part allocator``)."""
        stream = _state.stream if scopes_entered else LEGACY
        if stream.scratch is not None:
            return self.in_scratch(stream, size)
        err, ptr = self._alloc_async(size, self._pool, stream.handle)
        if err:
            ptr = self._after_error(size, stream, err)
        ledger = self.ledger
        ledger[ptr] = size
        self._note(size)
        self._drain_if_due()
        return PoolPointer(self._context, ptr, size, partial(self._release_bound, ledger, ptr, stream))

    def _no_scratch(self, stream: StreamRef, size: int) -> PoolPointer:
        raise RuntimeError(f"numba_pool: {size} bytes requested inside a scratch scope with no scratch handler set")

    def _after_error(self, size: int, stream: StreamRef, err):
        if err != OUT_OF_MEMORY:
            raise CudaAPIError(err, f"numba_pool: cuMemAllocFromPoolAsync({size} bytes) failed with {err.name}")
        return self._on_out_of_memory(size, partial(self._retry, size, stream))

    def _retry(self, size: int, stream: StreamRef):
        return check(self._alloc_async(size, self._pool, stream.handle), f"cuMemAllocFromPoolAsync({size} bytes)")

    def _release(self, ledger: dict, ptr, stream: StreamRef) -> None:
        # Any thread, from a finalizer: never raises.
        size = ledger.pop(ptr, None)
        if size is None:  # a reset freed it already
            return
        self._note(~size)
        waits = self._waits
        if waits.recorded or waits.depth or stream.thread is not None:
            waits.release(int(ptr), stream, partial(self._free, ptr, stream))
            return
        owner = waits.owner
        if owner.several and owner.needed():  # rule 10: another device's context is current
            owner.run(waits.release, int(ptr), stream, partial(self._free, ptr, stream))
            return
        err, = self._free_async(ptr, stream.handle)
        if err:
            if owner.needed():  # rule 10: no context is current in this thread
                owner.run(waits.release, int(ptr), stream, partial(self._free, ptr, stream))
                return
            report_failure((err,), f"cuMemFreeAsync({int(ptr):#x})")

    def _free(self, ptr, stream: StreamRef, synchronized: bool) -> None:
        # After a synchronize nothing earlier remains: the legacy stream will do.
        handle = LEGACY.handle if synchronized else stream.handle
        check(self._free_async(ptr, handle), f"cuMemFreeAsync({int(ptr):#x})")

    def take_all(self) -> list:
        """Forget every live allocation (for a reset): returns their pointers; finalizers that
        run later find nothing."""
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


class _Domain:
    """The free blocks of one stream (rule 1): a heap of its slabs and, but for the legacy
    domain, the event of rule 5."""

    __slots__ = ("key", "heap", "event")

    def __init__(self, key, event=None):
        self.key = key
        self.heap = Heap()
        self.event = event


class _Quarantine:
    """Rule 4's state: legacy-stream blocks freed and not yet fenced, and the fenced ones kept
    ready for lock-free allocation (glibc's tcache idea), each as rounded size -> starts.

    ``waiting`` lists are appended to without a lock by releases and emptied by :meth:`take`
    under the arena's lock; ``ready`` lists are popped without a lock by allocations and filled
    under the lock."""

    def __init__(self, cache_limit: int):
        self.waiting: dict[int, list[int]] = {}
        self.ready: dict[int, list[int]] = {}
        self.cache_limit = cache_limit

    def add(self, start: int, size: int) -> None:
        waiting = self.waiting.get(size)
        if waiting is None:
            waiting = self.waiting.setdefault(size, [])
        waiting.append(start)

    def count(self) -> int:
        return sum(map(len, list(self.waiting.values())))

    def take(self) -> dict[int, list[int]]:
        """The snapshot before a fence: every block waiting now, as rounded size -> starts."""
        taken = {}
        for size, waiting in list(self.waiting.items()):
            count = len(waiting)
            if count:
                # Two C-level steps: a release appending meanwhile lands after the first `count`
                # and stays for the next fence.
                taken[size] = waiting[:count]
                del waiting[:count]
        return taken

    def put_back(self, taken: dict[int, list[int]]) -> None:
        for size, starts in taken.items():
            for start in starts:
                self.add(start, size)

    def make_ready(self, taken: dict[int, list[int]]) -> list[tuple[int, int]]:
        """Fenced blocks fill the cache first, a list at a time; returns those that did not fit,
        as (start, size)."""
        rest = []
        for size, starts in taken.items():
            ready = self.ready.get(size)
            if ready is None:
                ready = self.ready.setdefault(size, [])
            room = self.cache_limit - len(ready)
            if room > 0:
                ready.extend(starts[:room])
                starts = starts[room:]
            rest += [(start, size) for start in starts]
        return rest

    def take_ready(self) -> list[tuple[int, int]]:
        taken = []
        for size, ready in list(self.ready.items()):
            while True:
                try:
                    taken.append((ready.pop(), size))
                except IndexError:  # empty, or an allocation took the last one
                    break
        return taken

    def bytes(self) -> tuple[int, int]:
        """(quarantined, cached) bytes."""
        def total(lists):
            return sum(size * len(starts) for size, starts in list(lists.items()))
        return total(self.waiting), total(self.ready)


class _ArenaInspection:
    """The arena's read-only views, for ``record_stream``, IPC, statistics and the tests: a
    part of :class:`ArenaBlocks` (its state and lock), kept apart from allocation and release."""

    def block_size(self, address: int) -> int | None:
        """The rounded size of the live block starting at ``address``, else None."""
        with self._lock:
            size = self.taken.get(address)
            return None if size is None or self._is_released(address, size) else size

    def containing_block(self, address: int) -> int | None:
        """The start of the live block that contains ``address``, else None (a scan:
        record_stream is rare).  A block whose release ``defer_cleanup`` holds back still
        counts as live."""
        with self._lock:
            for start, size in self.taken.items():
                if start <= address < start + size:
                    return None if self._is_released(start, size) else start
            return None

    def slab_of(self, address: int) -> tuple[int, int] | None:
        """``(start, size)`` of the slab holding ``address``, else None."""
        with self._lock:
            for domain in self._domains.values():
                for start, size in domain.heap.slabs.items():
                    if start <= address < start + size:
                        return start, size
            return None

    def _is_released(self, start: int, size: int) -> bool:
        # Under _lock.  list() copies: releases append to these lists without the lock.
        return (start in list(self._waiting.get(size, ())) or start in list(self.ready.get(size, ()))
                or any(start == s for s, _, _ in list(self._released)))

    def statistics(self) -> ArenaStatistics:
        with self._lock:
            self._publish_released()
            quarantined, cached = self._quarantine.bytes()
            heaps = [d.heap for d in self._domains.values()]
            return ArenaStatistics(
                reserved=self._reserved, in_use=sum(self.taken.values()) - quarantined - cached, cached=cached,
                quarantined=quarantined, free=sum(h.free_bytes() for h in heaps),
                free_blocks=sum(len(h.free_blocks()) for h in heaps),
                largest_free_block=max([h.largest_free() for h in heaps] + [0]),
                slabs=sum(len(h.slabs) for h in heaps), domains=len(heaps), fences=self.fences)

    def check_invariants(self) -> None:
        """Raise AssertionError unless every domain's slabs are tiled exactly by its free blocks
        and the blocks out of the heaps (:attr:`taken`), every quarantined and ready block is
        one of those, at its size and once, and the byte counts add up (tests)."""
        with self._lock:
            self._publish_released()
            taken = dict(self.taken)
            seen = set()
            for size, starts in [*self._quarantine.waiting.items(), *self.ready.items()]:
                for start in list(starts):
                    assert taken.get(start) == size, f"free block {start:#x} ({size} bytes) is not out of the heap"
                    assert start not in seen, f"block {start:#x} is twice in the quarantine or the cache"
                    seen.add(start)
            for domain in self._domains.values():
                domain.heap.check_invariants(taken)
            reserved = sum(d.heap.reserved for d in self._domains.values())
            assert reserved == self._reserved
            stats_in_slabs = sum(taken.values()) + sum(d.heap.free_bytes() for d in self._domains.values())
            assert stats_in_slabs == reserved, f"{stats_in_slabs} bytes in blocks, {reserved} in slabs"


class ArenaBlocks(_ArenaInspection):
    """Blocks of up to ``max_block`` bytes carved out of slabs taken from the mempool, one
    domain per stream (rules 1 and 3-6).

    :param slab_size: the largest slab (bytes); slabs start at :data:`FIRST_SLAB` and grow with
        the arena (:meth:`next_slab_size`).
    :param release_threshold: bytes of slabs kept when one becomes empty; beyond it an empty slab
        goes back to the mempool at once.  None keeps them all (until trim).
    :raises ArenaError: for a ``slab_size`` or ``max_block`` that is not a multiple of 256 or a
        ``max_block`` above ``slab_size``.
    """

    def __init__(self, cu, pool_handle, context, waits: StreamWaits, usage, on_out_of_memory, *,
                 slab_size: int, max_block: int, release_threshold: int | None = None):
        if slab_size % ALIGNMENT or max_block % ALIGNMENT or not 0 < max_block <= slab_size:
            raise ArenaError(f"slab size ({slab_size}) and largest block ({max_block}) must be multiples of "
                             f"{ALIGNMENT} bytes with 0 < largest block <= slab size")
        _bind_source(self, cu, pool_handle, context, waits, usage, on_out_of_memory)
        self._cu = cu
        self._device_pointer = cu.CUdeviceptr
        self.slab_size, self.max_block, self.release_threshold = slab_size, max_block, release_threshold
        self.quarantine_limit = QUARANTINE_BLOCKS  # tests set -1: fence before every miss
        self._lock = threading.Lock()
        # Blocks out of the heaps: held by their owners, quarantined, ready, or released and not
        # yet published, as start -> rounded size.  Kept off the hot path (a ready block moves
        # without touching it; a dict update there cost 0.15 µs per allocation, bench); changed
        # only where a heap hands a block out or takes it back.  Guarded by _lock.
        self.taken: dict[int, int] = {}
        self._quarantine = _Quarantine(CACHE_BLOCKS)
        self.ready = self._quarantine.ready
        self._waiting = self._quarantine.waiting  # the release's hot path appends here directly
        self._released: deque = deque()  # (start, size, domain) released on other streams, to publish
        self._legacy = _Domain(LEGACY.key)
        self._domains: dict = {LEGACY.key: self._legacy}  # stream key -> _Domain; guarded by _lock
        self._fence_event = check(cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate")
        self._reserved = 0
        self.fences = 0
        self.dropped = False
        # Bound once: a bound method made per allocation cost 0.1 µs (bench).
        self._release_legacy_bound = self._release_legacy
        self._release_scoped_bound = self._release_scoped
        # Where requests the arena does not serve go: the manager sets its mempool path.
        self.delegate: Callable[[int], PoolPointer] = self._not_served

    # -- allocation ---------------------------------------------------------------------------

    def allocate(self, size: int) -> PoolPointer:
        """The EMM plugin's ``memalloc`` in arena mode: ``size`` bytes for work on the thread's
        allocation stream.  Above ``max_block`` bytes, and inside ``numba_pool.scratch``, it
        hands the request to :attr:`delegate` (the mempool path).

        The legacy stream's path (no scope) is the hot one: a ready block is one ``list.pop``,
        no lock and no driver call.  The manager binds this method as its ``memalloc``: one
        call layer fewer than dispatching in the manager.
        """
        if size > self.max_block:
            return self.delegate(size)
        stream = _state.stream if scopes_entered else LEGACY
        if stream is not LEGACY:
            if stream.scratch is not None:
                return self.delegate(size)
            return self.allocate_scoped(size, stream)
        rounded = round_up(size)
        ready = self.ready.get(rounded)
        start = None
        if ready:
            try:
                start = ready.pop()
            except IndexError:  # another thread took the last one
                pass
        if start is None:
            start = self._allocate(rounded, LEGACY, self._take_legacy)
        self._note(size)
        return PoolPointer(self._context, self._device_pointer(start), size,
                           partial(self._release_legacy_bound, start, size, rounded))

    def _not_served(self, size: int) -> PoolPointer:
        raise ArenaError(f"{size} bytes is above the arena's largest block ({self.max_block} bytes) "
                         "or inside a scratch scope, and no delegate is set")

    def allocate_scoped(self, size: int, stream: StreamRef) -> PoolPointer:
        """``size`` bytes for work on ``stream`` (a ``using_stream`` scope): its domain's heap."""
        rounded = round_up(size)
        start, domain = self._allocate(rounded, stream, self._take_scoped)
        self._note(size)
        return PoolPointer(self._context, self._device_pointer(start), size,
                           partial(self._release_scoped_bound, start, size, rounded, stream, domain))

    def _allocate(self, rounded: int, stream: StreamRef, take):
        if rounded > self.max_block:
            raise ArenaError(f"{rounded} bytes is above the arena's largest block ({self.max_block} bytes)")
        self._drain_if_due()
        try:
            with self._lock:
                return take(rounded, stream)
        except CudaAPIError as err:
            if err.code != OUT_OF_MEMORY:
                raise
        return self._on_out_of_memory(rounded, partial(self._take_locked, take, rounded, stream))

    def _take_locked(self, take, rounded: int, stream: StreamRef):
        with self._lock:
            return take(rounded, stream)

    def _take_legacy(self, rounded: int, stream: StreamRef) -> int:
        self._publish_released()
        quarantined = self._quarantine.count()
        if quarantined >= REFILL_AT or quarantined > self.quarantine_limit:
            self._fence()
            ready = self.ready.get(rounded)
            if ready:
                return ready.pop()
        legacy = self._legacy
        start = self._carve(legacy, rounded)
        if start is None and self._quarantine.count():  # rather than a new slab
            self._fence()
            ready = self.ready.get(rounded)
            if ready:
                return ready.pop()
            start = self._carve(legacy, rounded)
        if start is None:
            self._new_slab(legacy, stream, rounded)
            start = self._carve(legacy, rounded)
        return start

    def _take_scoped(self, rounded: int, stream: StreamRef) -> tuple[int, _Domain]:
        self._publish_released()
        if self._quarantine.count() > self.quarantine_limit:
            self._fence()
        key = stream.key
        if key is None:  # rule 6: the driver's id, never the handle's value
            key = stream.key = check(self._cu.cuStreamGetId(stream.handle), "cuStreamGetId")
        domain = self._domains.get(key)
        if domain is None:
            event = check(self._cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate")
            domain = self._domains[key] = _Domain(key, event)
        start = self._carve(domain, rounded)
        if start is None:
            self._new_slab(domain, stream, rounded)
            start = self._carve(domain, rounded)
        return start, domain

    def _carve(self, domain: _Domain, rounded: int) -> int | None:
        start = domain.heap.allocate(rounded)
        if start is not None:
            self.taken[start] = rounded
        return start

    def next_slab_size(self, need: int) -> int:
        """The size of the next slab for a request of ``need`` bytes: the power of two nearest
        above 1/GROWTH of the bytes reserved, or BLOCKS_PER_SLAB requests if more, between
        FIRST_SLAB and ``slab_size``, and at least ``need``."""
        target = 1 << max(0, (self._reserved // GROWTH - 1).bit_length())
        return max(need, min(self.slab_size, max(FIRST_SLAB, target, BLOCKS_PER_SLAB * need)))

    def _new_slab(self, domain: _Domain, stream: StreamRef, need: int) -> None:
        size = self.next_slab_size(need)
        ptr = check(self._alloc_async(size, self._pool, stream.handle), f"cuMemAllocFromPoolAsync({size}) for an arena slab")
        if domain.event is not None:  # rule 5: the slab is usable from this point of the stream on
            check(self._cu.cuEventRecord(domain.event, stream.handle), "cuEventRecord (arena slab)")
        domain.heap.add_slab(int(ptr), size)
        self._reserved += size

    # -- release ------------------------------------------------------------------------------

    def _release_legacy(self, start: int, size: int, rounded: int) -> None:
        # Any thread, from a finalizer, no lock, never raises: the common case is two atomic
        # operations and no driver call.  Once per block: PoolPointer releases once.
        if self.dropped:  # a reset dropped it
            return
        self._note(~size)
        waits = self._waits
        if waits.recorded or waits.depth:
            waits.release(start, LEGACY, partial(self._quarantine_block, start, rounded))
            return
        waiting = self._waiting.get(rounded)  # _Quarantine.add, inlined: the hot path
        if waiting is None:
            waiting = self._waiting.setdefault(rounded, [])
        waiting.append(start)

    def _quarantine_block(self, start: int, rounded: int, synchronized: bool) -> None:
        self._quarantine.add(start, rounded)

    def _release_scoped(self, start: int, size: int, rounded: int, stream: StreamRef, domain: _Domain) -> None:
        if self.dropped:
            return
        self._note(~size)
        self._waits.release(start, stream, partial(self._publish_scoped, start, rounded, stream, domain))

    def _publish_scoped(self, start: int, rounded: int, stream: StreamRef, domain: _Domain, synchronized: bool) -> None:
        if self.dropped:
            return
        if not synchronized:  # rule 5: the event covers the block before anyone can see it
            check(self._cu.cuEventRecord(domain.event, stream.handle), "cuEventRecord (arena release)")
        self._released.append((start, rounded, domain))

    def _publish_released(self) -> None:
        released = self._released
        while released:
            start, rounded, domain = released.popleft()
            self._free_into(domain, start, rounded)

    def _fence(self) -> None:
        """Rule 4: snapshot, then the barrier, then publish."""
        taken = self._quarantine.take()
        if not taken:
            return
        try:
            check(self._cu.cuEventRecord(self._fence_event, LEGACY.handle), "cuEventRecord (arena fence)")
        except CudaAPIError:
            self._quarantine.put_back(taken)
            raise
        self.fences += 1
        for start, size in sorted(self._quarantine.make_ready(taken)):
            self._free_into(self._legacy, start, size)

    def _flush_ready(self) -> None:
        for start, size in sorted(self._quarantine.take_ready()):
            self._free_into(self._legacy, start, size)

    def _free_into(self, domain: _Domain, start: int, size: int) -> None:
        self.taken.pop(start, None)
        heap = domain.heap
        start, size = heap.free(start, size)
        if heap.is_empty_slab(start, size) and self._gives_back(domain):
            self._return_slab(domain, start)

    def _gives_back(self, domain: _Domain) -> bool:
        # An empty slab stays unless the arena is over its release threshold; a stream's domain
        # keeps only its last one, so that streams that are gone hold at most one slab each.
        if self.release_threshold is not None and self._reserved > self.release_threshold:
            return True
        return domain is not self._legacy and len(domain.heap.slabs) > 1

    def _return_slab(self, domain: _Domain, start: int) -> None:
        """A wholly free slab back to the mempool, ordered after its domain's last release."""
        cu, legacy = self._cu, LEGACY.handle
        if domain.event is not None:  # rule 5: wait for the event, never touch the stream
            check(cu.cuStreamWaitEvent(legacy, domain.event, 0), "cuStreamWaitEvent (arena slab)")
        check(cu.cuMemFreeAsync(cu.CUdeviceptr(start), legacy), "cuMemFreeAsync (arena slab)")
        self._reserved -= domain.heap.remove_slab(start)
        if domain is not self._legacy and not domain.heap.slabs:
            del self._domains[domain.key]
            cu.cuEventDestroy(domain.event)  # the driver keeps it until pending waits are done

    # -- barriers, statistics, reset ------------------------------------------------------------

    @property
    def reserved_bytes(self) -> int:
        """Bytes of slabs held now (every domain)."""
        return self._reserved

    @property
    def cache_limit(self) -> int:
        """Ready blocks kept per size (tests set 0, with ``quarantine_limit`` -1, so that a
        freed block is reused by the very next allocation)."""
        return self._quarantine.cache_limit

    @cache_limit.setter
    def cache_limit(self, blocks: int) -> None:
        self._quarantine.cache_limit = blocks

    def flush_cache(self) -> None:
        """Give every ready block back to the legacy heap, coalescing."""
        with self._lock:
            self._flush_ready()

    def release_cached(self) -> int:
        """Fence, then give every wholly free slab of every domain back to the mempool
        (stream-ordered: no host synchronization).  Returns the bytes released."""
        with self._lock:
            self._publish_released()
            self._fence()
            self._flush_ready()
            before = self._reserved
            for domain in list(self._domains.values()):
                for start, _ in domain.heap.empty_slabs():
                    self._return_slab(domain, start)
            return before - self._reserved

    def drop_all(self) -> list[tuple[int, int]]:
        """Forget everything (for a reset): returns the slabs as (start, size) for the caller to
        free; blocks still held are abandoned and their releases do nothing."""
        with self._lock:
            self.dropped = True
            self.taken.clear()
            slabs = [slab for domain in self._domains.values() for slab in domain.heap.slabs.items()]
            for domain in self._domains.values():
                if domain.event is not None:
                    self._cu.cuEventDestroy(domain.event)
            self._cu.cuEventDestroy(self._fence_event)
            self._domains.clear()
            self._released.clear()
            self._quarantine = _Quarantine(0)
            self.ready, self._waiting = self._quarantine.ready, self._quarantine.waiting
            self._reserved = 0
            return slabs

class StreamOrdering:
    """One manager's memory and its ordering: the mempool path (:class:`PooledBlocks`), the
    arena when it is on (:class:`ArenaBlocks`), ``record_stream``, ``defer_cleanup``, and the
    barriers that synchronize (trim, out of memory, reset).

    :param cu: the driver object (:mod:`numba_pool.driver`).
    :param pool: the device's mempool.
    :param context: the Numba context the pointers belong to.
    :param usage: the manager's :class:`~numba_pool.stats.UsageTracker`.
    :param before_retry: called before an allocation that ran out of memory is retried (Numba's
        pending deallocations).
    :param describe_out_of_memory: the message for an allocation of ``size`` bytes that failed
        again after the retry.
    """

    def __init__(self, cu, pool: MemPool, context, usage, config, *, before_retry: Callable[[], None],
                 describe_out_of_memory: Callable[[int], str]):
        self._cu = cu
        self.pool = pool
        self._usage = usage
        self._before_retry = before_retry
        self._describe = describe_out_of_memory
        self.waits = StreamWaits(cu, OwnerContext(cu, getattr(context, "handle", None)))
        # Live numba_pool.scratch blocks by start address (atomic dict operations only).
        self.scratch_blocks: dict[int, object] = {}
        self.pooled = PooledBlocks(cu, pool.handle, context, self.waits, usage, self.out_of_memory)
        self.arena = None
        if config.arena:
            threshold = None if config.release_threshold == KEEP_ALL else config.release_threshold
            self.arena = ArenaBlocks(cu, pool.handle, context, self.waits, usage, self.out_of_memory,
                                     slab_size=config.arena_slab_size, max_block=config.arena_max_block,
                                     release_threshold=threshold)

    def record_stream(self, address: int, stream: StreamRef) -> bool:
        """Rule 2 for the block holding ``address``; False when no live block holds it.  In a
        scratch block the record belongs to the array carved from it, which applies it when it
        is dropped (:meth:`StreamWaits.order_now`): the block is released later, when the
        stream may be gone."""
        start = self.pooled.containing_block(address)
        if start is None and self.arena is not None:
            start = self.arena.containing_block(address)
        if start is None:
            return False
        scratch = self.scratch_blocks.get(start)
        if scratch is not None:
            return scratch.record(address, stream)
        self.waits.record(start, stream)
        return True

    def allocation_of(self, address: int) -> tuple[int, int] | None:
        """``(base, size)`` in bytes of the mempool allocation that holds the live block at
        ``address``: the block itself on the mempool path, its slab in the arena (what
        ``cuMemPoolExportPointer`` accepts); None when no live block holds it."""
        start = self.pooled.containing_block(address)
        if start is not None:
            return start, self.pooled.block_size(start)
        if self.arena is not None and self.arena.containing_block(address) is not None:
            return self.arena.slab_of(address)
        return None

    def out_of_memory(self, size: int, retry: Callable):
        """An allocation of ``size`` bytes ran out of memory: make room, ``retry()`` once.

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with :attr:`describe_out_of_memory`'s
            message when the retry fails too.
        """
        self._usage.count_oom(failed=False)
        self._before_retry()
        self.trim(0)
        try:
            return retry()
        except CudaAPIError as err:
            self._usage.count_oom(failed=True)
            if err.code != OUT_OF_MEMORY:
                raise
            raise CudaAPIError(err.code, self._describe(size)) from None

    def trim(self, keep_bytes: int) -> None:
        """Give the arena's empty slabs back (rule 4's snapshot and fence first, then
        stream-ordered frees), synchronize so that every stream-ordered free has completed, and
        release the pool's unused memory down to ``keep_bytes`` (``cuMemPoolTrimTo``)."""
        if self.arena is not None:
            self.arena.release_cached()
        check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize")
        self.pool.trim(keep_bytes)

    def reset(self) -> None:
        """Free everything and destroy the pool.  The snapshot (every live pointer, every slab)
        is taken before the synchronize; finalizers that run later find nothing to free."""
        pointers = self.pooled.take_all()
        if self.arena is not None:
            pointers += [self._cu.CUdeviceptr(start) for start, _ in self.arena.drop_all()]
        self.waits.recorded.clear()
        while self.scratch_blocks:  # popitem, not a copy: a finalizer may pop one meanwhile
            try:
                self.scratch_blocks.popitem()[1].forget()
            except KeyError:
                break
        report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize (reset)")
        self.waits.flush()  # held-back mempool frees: issued now, before the pool goes
        for ptr in pointers:
            report_failure(self._cu.cuMemFreeAsync(ptr, LEGACY.handle), "cuMemFreeAsync (reset)")
        report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize (reset)")
        with contextlib.suppress(CudaAPIError):
            self.pool.destroy()
